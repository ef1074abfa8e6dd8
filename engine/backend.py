"""Backends chosen by device string at run time; GPU stacks load only when asked for."""

from __future__ import annotations

from typing import Any, Protocol


class Backend(Protocol):
    name: str
    kernels: dict[str, Any]

    def from_numpy(self, array: Any) -> Any: ...
    def to_numpy(self, array: Any) -> Any: ...
    def scalar(self, value: Any, dtype: str) -> Any: ...
    def conform(self, array: Any, dtype: Any) -> Any: ...
    def synchronize(self) -> None: ...


class BackendUnavailable(RuntimeError):
    """The device string names a backend this machine cannot run (no GPU, no driver)."""


def parse_device(spec: str) -> tuple[str, int]:
    """'cpu' -> ('cpu', 0); 'cuda:1' -> ('cuda', 1); 'opencl' -> ('opencl', 0)."""
    kind, _, index = spec.strip().lower().partition(":")
    if kind not in ("cpu", "cuda", "opencl"):
        raise ValueError(f"unknown device {spec!r}: expected cpu, cuda[:N] or opencl[:N]")
    try:
        n = int(index) if index else 0
    except ValueError:
        raise ValueError(f"bad device index in {spec!r}") from None
    if n < 0:
        raise ValueError(f"bad device index in {spec!r}")
    return kind, n


_CACHE: dict[tuple[str, int], Backend] = {}


def get_backend(spec: str) -> Backend:
    """The backend for a device string, created once per process."""
    key = parse_device(spec)
    if key not in _CACHE:
        kind, index = key
        if kind == "cpu":
            from .backends.numpy_backend import NumpyBackend

            _CACHE[key] = NumpyBackend()
        elif kind == "cuda":
            try:
                from .backends.cupy_backend import CupyBackend  # type: ignore[import-not-found]
            except ImportError as exc:
                raise BackendUnavailable(
                    f"cuda:{index}: the CuPy backend is not available ({exc})"
                ) from None
            _CACHE[key] = CupyBackend(index)
        else:
            try:
                from .backends.opencl_backend import OpenCLBackend  # type: ignore[import-not-found]
            except ImportError as exc:
                raise BackendUnavailable(
                    f"opencl: the PyOpenCL backend is not available ({exc})"
                ) from None
            _CACHE[key] = OpenCLBackend(index)
        from .extensions import install

        install(_CACHE[key])  # extension kernels registered so far, and later ones
    return _CACHE[key]
