"""The CUDA backend (CuPy): NumPy's kernels on CuPy arrays, table ops and fused chains as
generated `ElementwiseKernel`s, the adaptive pool as CuPy's allocator, a stream per session.

CuPy is imported when a backend is made, never at module import, so this module (and the
code generation, which the tests check without a GPU) loads on machines without CUDA.

- Kernels: numpy_kernels is written against the array module of its inputs (`_mod`), so
  the same code runs on CuPy; the elementwise ops are generated from the one C expression
  table (cexpr), like OpenCL's; `full` is made here; `uniform` runs the documented counter
  hash on the device (the key never comes back to the host), identical on every backend.
- Fusion: `optimize_plan` (called once per compiled, cached graph) merges elementwise
  chains into one kernel each (engine/fusion.py); BURN_REMOTE_FUSION=0 turns it off.
- Memory: unless BURN_REMOTE_POOL=0, CuPy allocates from engine.memory's adaptive pool
  (CupyPageAllocator + install_cupy_allocator, one pool per device); the first run of each
  plan is the pool's dry run, which sizes its pages and the reserve it keeps, so replayed
  steps never call cudaMalloc/cudaFree. `memory_stats()` reports it.
- Streams: `session()` gives each runtime (a local device or a server session) a view of
  the backend with its own non-blocking stream; the executor compiles and runs plans inside
  `activate()`; uploads, reads and host fallbacks use the stream that is active, so every
  copy is ordered with the plan that reads or writes it.
- bfloat16: CuPy (14+) stores it (ml_dtypes); generated kernels compute it in float, and
  the NumPy-shaped kernels compute it in float32 and round once, where CuPy's own routines
  have no bfloat16 loops.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ...protocol import dtypes
from ...protocol.registry import OPS
from ..backend_base import Backend, BackendUnavailable
from . import cexpr
from .numpy_kernels import KERNELS as NUMPY_KERNELS

CUDA_TYPES = {
    "bool": "bool",
    "int8": "signed char",
    "uint8": "unsigned char",
    "int32": "int",
    "int64": "long long",
    "float16": "float",
    "bfloat16": "float",
    "float32": "float",
    "float64": "double",
}
"""CUDA C compute type of each dtype (float16 computes in float, as on OpenCL)."""

CUPY_PARAM = {"bool": "bool", "float16": "float16", **{d: d for d in dtypes.DTYPES}}
"""How an `ElementwiseKernel` parameter of each dtype is declared."""


def fused_kernel_source(program: Any) -> tuple[str, str, str]:
    """(in_params, out_params, operation) of the ElementwiseKernel for a FusedProgram."""
    ins = ", ".join(f"{CUPY_PARAM[d]} x{k}" for k, d in enumerate(program.inputs))
    outs = f"{CUPY_PARAM[program.out_dtype]} out"
    body = program.body(CUDA_TYPES, lambda k: f"x{k}")
    last = f"t{len(program.instructions) - 1}"
    store = f"out = ({last} != 0);" if program.out_dtype == "bool" else f"out = {last};"
    return ins, outs, "\n".join([*body, store])


class _Spec:
    __slots__ = ("shape", "dtype")

    def __init__(self, shape: tuple[int, ...], dtype: str) -> None:
        self.shape, self.dtype = shape, dtype


_BF16 = dtypes.to_numpy("bfloat16")


def _bfloat16_in_float32(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A NumPy-shaped kernel that runs bfloat16 operands in float32 (the executor's
    `conform` rounds the results back to the declared dtype)."""

    def run(*xs: Any, **attrs: Any) -> Any:
        for x in xs:
            if getattr(x, "dtype", None) == _BF16:
                xs = tuple(
                    a.astype(np.float32) if getattr(a, "dtype", None) == _BF16 else a for a in xs
                )
                break
        return fn(*xs, **attrs)

    run.__wrapped__ = fn  # type: ignore[attr-defined]
    return run


def _import_cupy(index: int) -> Any:
    try:
        import cupy
    except ImportError as exc:
        raise BackendUnavailable(
            f"cuda:{index}: CuPy is not installed ({exc}); pip install 'burn-remote[cuda]'"
        ) from None
    return cupy


class CupyBackend(Backend):
    """One CUDA device through CuPy.

    Args:
        index: the CUDA device number.
        cupy: the CuPy module (tests pass a stand-in; default: ``import cupy``).
    """

    activates = True  # kernels run on this backend's device and stream
    reports_memory = True  # the adaptive pools are CuPy's allocator

    def __init__(self, index: int = 0, cupy: Any = None) -> None:
        cupy = _import_cupy(index) if cupy is None else cupy
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # no driver, no device: CuPy raises its own errors
            raise BackendUnavailable(f"cuda:{index}: no CUDA device ({exc})") from None
        if count <= index:
            raise BackendUnavailable(f"cuda:{index}: CuPy sees {count} CUDA device(s)")
        self.cp = cupy
        self.index = index
        self.name = f"cuda:{index}"
        self.device = cupy.cuda.Device(index)
        with self.device:  # a stream belongs to the device current when it is made
            self.stream = cupy.cuda.Stream(non_blocking=True)
        self.fusion = os.environ.get("BURN_REMOTE_FUSION", "1") != "0"
        self.memory: Any = None
        self.allocator: Any = None
        if os.environ.get("BURN_REMOTE_POOL", "1") != "0":
            from ..memory import CupyPageAllocator, DeviceMemory, install_cupy_allocator

            with self.device:
                self.memory = DeviceMemory(self.name, CupyPageAllocator(index), retain=True)
                self.allocator = install_cupy_allocator(self.memory)
        self._ew: dict[tuple[Any, ...], Any] = {}
        shared = {name: _bfloat16_in_float32(fn) for name, fn in NUMPY_KERNELS.items()}
        self.kernels: dict[str, Any] = {**shared, **self._own_kernels()}

    # --- the Backend protocol --------------------------------------------------------------
    def from_numpy(self, array: np.ndarray) -> Any:
        with self.device, self._copy_stream():
            return self.cp.asarray(array)

    def to_numpy(self, array: Any) -> np.ndarray:
        with self.device:
            return self.cp.asnumpy(array, stream=self._copy_stream(), blocking=True)

    def scalar(self, value: Any, dtype: str) -> Any:
        return self.from_numpy(np.asarray(value, dtype=dtypes.to_numpy(dtype)))

    def conform(self, array: Any, dtype: np.dtype) -> Any:
        if not isinstance(array, self.cp.ndarray):
            array = self.cp.asarray(array)
        return array if array.dtype == dtype else array.astype(dtype)

    def synchronize(self) -> None:
        self.stream.synchronize()

    # --- sessions and streams ----------------------------------------------------------------
    def session(self) -> CupyBackend:
        """A view of this backend with its own stream (kernels and caches are shared)."""
        view = object.__new__(type(self))
        view.__dict__.update(self.__dict__)
        with self.device:
            view.stream = self.cp.cuda.Stream(non_blocking=True)
        return view

    @contextlib.contextmanager
    def activate(self, plan: Any = None) -> Iterator[None]:
        """Run everything inside on this backend's device and stream; the first run of a
        `plan` is the pool's dry run (statistics that size its pages and reserve)."""
        dry = plan is not None and plan.runs == 0 and self.memory is not None
        with self.device, self.stream:
            if not dry:
                yield
                return
            with self.allocator.lock:
                self.memory.begin_dry_run()
            try:
                yield
            finally:
                with self.allocator.lock:
                    self.memory.end_dry_run()

    def _copy_stream(self) -> Any:
        """The stream a host copy goes on: the one active in this thread (a plan running on
        a session's stream, for host fallbacks), else this backend's own."""
        current = self.cp.cuda.get_current_stream()
        return self.stream if current.ptr in _DEFAULT_STREAMS else current

    def memory_stats(self) -> Any:
        if self.memory is None:
            return None
        self.allocator.collect()
        with self.allocator.lock:
            return self.memory.memory_stats()

    # --- generated kernels -----------------------------------------------------------------
    def optimize_plan(self, plan: Any) -> Any:
        if not self.fusion:
            return plan
        from ..fusion import fuse_plan

        return fuse_plan(plan, self._fused)

    def _fused(self, program: Any) -> Any:
        key = (program.inputs, program.instructions)
        k = self._ew.get(key)
        if k is None:
            k = self._ew[key] = self.compile_program(program, f"br_fused_{len(self._ew)}")
        return k

    def compile_program(self, program: Any, name: str) -> Any:
        """The kernel of one FusedProgram (CuPy compiles it with NVRTC on first launch)."""
        ins, outs, op = fused_kernel_source(program)
        return self.cp.ElementwiseKernel(ins, outs, op, name, preamble=cexpr.PREAMBLE)

    def _table(self, name: str) -> Any:
        from ..fusion import FusedProgram

        def run(*xs: Any) -> Any:
            names = tuple(dtypes.from_numpy(x.dtype) for x in xs)
            (spec,) = OPS[name].shapes([_Spec(x.shape, n) for x, n in zip(xs, names)], {})
            refs = tuple(("in", k) for k in range(len(xs)))
            program = FusedProgram(names, ((name, refs, spec[1]),))
            return self._fused(program)(*xs)

        return run

    def _own_kernels(self) -> dict[str, Any]:
        cp = self.cp
        own = {name: self._table(name) for name in cexpr.FUSABLE if name != "cast"}

        def full(shape: Any, value: Any, dtype: str) -> Any:
            dt = dtypes.to_numpy(dtypes.normalize(dtype))
            return cp.full(tuple(shape), value, dtype=dt)

        own["full"] = full
        return own


_DEFAULT_STREAMS = (0, 1, 2)
"""Stream handles of CUDA's legacy (0, 1) and per-thread (2) default streams."""
