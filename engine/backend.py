"""The backend registry: device kind -> factory; GPU stacks load only when asked for.

`get_backend("cuda:1")` parses the string, finds the kind's factory in `FACTORIES`, creates
the backend once per process and gives it the extension kernels registered so far. A new
backend is one factory here and one kind in `backend_base.BACKEND_KINDS`.
"""

from __future__ import annotations

from collections.abc import Callable

from .backend_base import BACKEND_KINDS, Backend, BackendUnavailable, parse_device


def _numpy(index: int) -> Backend:
    from .backends.numpy_backend import NumpyBackend

    return NumpyBackend()


def _cupy(index: int) -> Backend:
    try:
        from .backends.cupy_backend import CupyBackend
    except ImportError as exc:
        raise BackendUnavailable(
            f"cuda:{index}: the CuPy backend is not available ({exc})"
        ) from None
    return CupyBackend(index)


def _opencl(index: int) -> Backend:
    try:
        from .backends.opencl_backend import OpenCLBackend
    except ImportError as exc:
        raise BackendUnavailable(f"opencl: the PyOpenCL backend is not available ({exc})") from None
    return OpenCLBackend(index)


FACTORIES: dict[str, Callable[[int], Backend]] = {"cpu": _numpy, "cuda": _cupy, "opencl": _opencl}
"""Device kind -> the function that creates its backend for a device index."""

_CACHE: dict[tuple[str, int], Backend] = {}


def get_backend(spec: str) -> Backend:
    """The backend for a device string, created once per process.

    Raises:
        ValueError: not a device string of a local backend.
        BackendUnavailable: this machine cannot run that backend (no GPU, no driver).
    """
    key = parse_device(spec)
    backend = _CACHE.get(key)
    if backend is None:
        from .extensions import install

        backend = _CACHE[key] = FACTORIES[key[0]](key[1])
        install(backend)  # extension kernels registered so far, and later ones
    return backend


__all__ = [
    "BACKEND_KINDS",
    "FACTORIES",
    "Backend",
    "BackendUnavailable",
    "get_backend",
    "parse_device",
]
