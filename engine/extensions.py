"""Kernels of extension ops, per backend kind, installed into each backend's kernel table.

An extension registers a kernel for a backend *kind* (``"cpu"``, ``"cuda"``, ``"opencl"``).
Backends created later receive it from :func:`install` (``get_backend`` calls it); backends
already alive receive it at once, so an extension imported after the first graph ran still
works. A backend with no kernel of its own for an extension op gets a host fallback built
from the ``"cpu"`` kernel (copy operands to NumPy, run, copy back): slow but correct, so an
extension with only a NumPy kernel already runs on every backend, and a native kernel
(CuPy, OpenCL) replaces the fallback whenever it is registered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .backend_base import BACKEND_KINDS, HOST_KIND, Backend, parse_device

_KERNELS: dict[str, dict[str, Callable[..., Any]]] = {kind: {} for kind in BACKEND_KINDS}
"""Backend kind -> wire op name -> kernel."""
_LIVE: list[Backend] = []
"""Backends that `install` has seen, to receive kernels registered later."""


def kind_of(backend: Backend) -> str:
    """A backend's kind from its name (``cpu``, ``cuda:0`` -> ``cuda``)."""
    return parse_device(backend.name)[0]


def per_backend(factory: Callable[[Backend], Callable[..., Any]]) -> Callable[..., Any]:
    """Mark a kernel *factory*: `factory(backend)` returns the kernel for that backend (OpenCL
    kernels launch on a backend's queue, so they are built per backend)."""
    factory.per_backend = True  # type: ignore[attr-defined]
    return factory


def register_kernel(kind: str, op: str, fn: Callable[..., Any]) -> None:
    """Make `fn` the kernel of extension op `op` on every backend of `kind`, now and later
    (`fn` may be a `per_backend` factory)."""
    if kind not in _KERNELS:
        raise ValueError(
            f"{op}: unknown backend kind {kind!r}; expected {', '.join(BACKEND_KINDS)}"
        )
    _KERNELS[kind][op] = fn
    for backend in _LIVE:
        _install_op(backend, op)


def kernels_of(op: str) -> dict[str, bool]:
    """Which backend kinds have a native kernel for `op` (for docs, errors and tests)."""
    return {kind: op in table for kind, table in _KERNELS.items()}


def install(backend: Backend) -> None:
    """Give a new backend every extension kernel registered so far, and later ones too."""
    if backend not in _LIVE:
        _LIVE.append(backend)
    ops = set(_KERNELS[HOST_KIND]) | set(_KERNELS[kind_of(backend)])
    for op in ops:
        _install_op(backend, op)


def _install_op(backend: Backend, op: str) -> None:
    kind = kind_of(backend)
    native = _KERNELS[kind].get(op)
    if native is not None:
        # A kernel that launches device code needs its backend (queue, compiler): such
        # kernels are registered as factories, called once per backend.
        backend.kernels[op] = native(backend) if getattr(native, "per_backend", False) else native
    elif op in _KERNELS[HOST_KIND]:
        backend.kernels[op] = _host_fallback(backend, _KERNELS[HOST_KIND][op])


def _host_fallback(backend: Backend, host: Callable[..., Any]) -> Callable[..., Any]:
    """Run a NumPy kernel on another backend's arrays by way of host copies."""

    def kernel(*arrays: Any, **attrs: Any) -> Any:
        result = host(*[backend.to_numpy(a) for a in arrays], **attrs)
        if isinstance(result, tuple):
            return tuple(backend.from_numpy(r) for r in result)
        return backend.from_numpy(result)

    kernel.host_fallback = True  # type: ignore[attr-defined]
    return kernel
