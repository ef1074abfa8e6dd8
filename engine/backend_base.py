"""What every engine backend is: the base class, its optional capabilities, the device kinds.

A leaf of the engine: the backends subclass `Backend`, the executor and extensions type
against it, and `engine/backend.py` (the registry) creates them, all without importing each
other in a circle. Optional capabilities are declared here with their defaults (a backend
that runs synchronously on the host needs none of them), so callers ask `backend.activates`
or call `backend.optimize_plan(plan)` instead of probing with `getattr`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from .executor import Plan

BACKEND_KINDS = ("cpu", "cuda", "opencl")
"""Every kind of local engine backend, as device strings spell them (``kind[:index]``);
`engine/backend.py` has one factory per kind (a test checks both lists agree)."""

HOST_KIND = "cpu"
"""The kind whose arrays are host NumPy arrays (extension fallbacks run there)."""


class BackendUnavailable(RuntimeError):
    """The device string names a backend this machine cannot run (no GPU, no driver)."""


def parse_device(spec: str) -> tuple[str, int]:
    """'cpu' -> ('cpu', 0); 'cuda:1' -> ('cuda', 1); 'opencl' -> ('opencl', 0).

    Raises:
        ValueError: not a local backend's device string, or a bad index.
    """
    kind, _, index = spec.strip().lower().partition(":")
    if kind not in BACKEND_KINDS:
        raise ValueError(f"unknown device {spec!r}: expected cpu, cuda[:N] or opencl[:N]")
    try:
        n = int(index) if index else 0
    except ValueError:
        raise ValueError(f"bad device index in {spec!r}") from None
    if n < 0:
        raise ValueError(f"bad device index in {spec!r}")
    return kind, n


class Backend:
    """One device's arrays and kernels, as the executor uses them.

    Subclasses set `name` (the device string) and `kernels` (op name -> kernel) and
    implement the four array conversions. The rest are optional capabilities, each with the
    default of a backend that runs synchronously on the host (the NumPy one).
    """

    name: str
    """The device string this backend serves (``cpu``, ``cuda:0``, ``opencl:0``)."""
    kernels: dict[str, Callable[..., Any]]
    """Op name -> kernel: takes this backend's arrays and the op's bound attributes."""

    activates: ClassVar[bool] = False
    """True when work must run inside `activate` (a GPU's device and stream). False lets the
    executor skip the context manager on every run, which is most of a small run's cost."""

    writes_into: ClassVar[Mapping[str, tuple[int, ...]]] = {}
    """Op name -> the input positions its kernel may write its results into, passed as
    ``out=`` (one per output for a multi-output kernel, candidates for a one-output one). The
    executor passes only inputs nothing else holds (a graph input only when its caller donated
    it), so an optimizer step updates parameters and moments where they lie and an
    elementwise op reuses a dying operand. Empty: kernels always make new arrays."""

    array_type: ClassVar[type | None] = None
    """The type of this backend's arrays when ``conform`` returns such an array of the
    declared dtype unchanged: the executor then skips the call for results that already
    conform (most of them). None: every result goes through ``conform``."""

    reports_memory: ClassVar[bool] = False
    """True when `memory_stats` reports the backend's own pools; otherwise callers keep
    their own count of the bytes they hold."""

    def from_numpy(self, array: Any) -> Any:
        """A host NumPy array as this backend's array (the same object on the host)."""
        raise NotImplementedError

    def to_numpy(self, array: Any) -> Any:
        """This backend's array as a host NumPy array (waits for the device)."""
        raise NotImplementedError

    def scalar(self, value: Any, dtype: str) -> Any:
        """A 0-d array of ``dtype`` (a registry dtype name) holding ``value``."""
        raise NotImplementedError

    def conform(self, array: Any, dtype: Any) -> Any:
        """A kernel's result made exactly the declared NumPy ``dtype``."""
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait until work queued on this backend is done (nothing to wait for by default)."""

    def activate(self, plan: Plan | None = None) -> AbstractContextManager[None]:
        """The context work on this backend runs in (only called when `activates`); the
        first run of ``plan`` may be a memory pool's dry run."""
        return contextlib.nullcontext()

    def session(self) -> Backend:
        """A view for one session or runtime (GPU backends: with a stream of its own; kernels
        and caches shared). By default the backend itself."""
        return self

    def optimize_plan(self, plan: Plan) -> Plan:
        """Rewrite a compiled plan once per cached graph (GPU backends fuse elementwise
        chains into generated kernels, engine/fusion.py). By default the plan as it is."""
        return plan

    def memory_stats(self) -> Any:
        """The backend's pools (`engine.memory` stats) when `reports_memory`, else None."""
        return None


__all__ = ["BACKEND_KINDS", "HOST_KIND", "Backend", "BackendUnavailable", "parse_device"]
