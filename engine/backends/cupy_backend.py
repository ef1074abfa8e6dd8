"""The CUDA backend (CuPy): NumPy's kernels on CuPy arrays, table ops and fused chains as
generated `ElementwiseKernel`s, the adaptive pool as CuPy's allocator, a stream per session.

CuPy is imported when a backend is made, never at module import, so this module (and the
code generation, which the tests check without a GPU) loads on machines without CUDA.

- Kernels: numpy_kernels is written against the array module of its inputs (`_mod`), so
  the same code runs on CuPy; the elementwise ops are generated from the one C expression
  table (cexpr), like OpenCL's; `full` and `uniform` are made here (`uniform` draws the
  documented counter hash on the host and uploads it, identical on every backend).
- Fusion: `optimize_plan` (called once per compiled, cached graph) merges elementwise
  chains into one kernel each (engine/fusion.py); BURN_REMOTE_FUSION=0 turns it off.
- Memory: unless BURN_REMOTE_POOL=0, CuPy allocates from engine.memory's adaptive pool
  (CupyPageAllocator + install_cupy_allocator); `memory_stats()` reports it.
- Streams: `session()` gives each runtime (a local device or a server session) a view of
  the backend with its own non-blocking stream; the executor runs plans inside `activate()`.
- bfloat16 has no CuPy dtype: tensors of it are refused on CUDA with a clear error.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from ...protocol import dtypes
from ...protocol.registry import OPS
from . import cexpr
from .numpy_kernels import KERNELS as NUMPY_KERNELS
from .numpy_kernels import uniform_bits

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


class CupyBackend:
    """One CUDA device through CuPy."""

    def __init__(self, index: int = 0) -> None:
        from ..backend import BackendUnavailable

        try:
            import cupy
        except ImportError as exc:
            raise BackendUnavailable(
                f"cuda:{index}: CuPy is not installed ({exc}); pip install 'burn-remote[cuda]'"
            ) from None
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
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.fusion = os.environ.get("BURN_REMOTE_FUSION", "1") != "0"
        self.memory: Any = None
        if os.environ.get("BURN_REMOTE_POOL", "1") != "0":
            from ..memory import CupyPageAllocator, DeviceMemory, install_cupy_allocator

            with self.device:
                self.memory = DeviceMemory(self.name, CupyPageAllocator(index))
                install_cupy_allocator(self.memory)
        self._ew: dict[tuple, Any] = {}
        self.kernels: dict[str, Any] = {**NUMPY_KERNELS, **self._own_kernels()}

    # --- the Backend protocol --------------------------------------------------------------
    def from_numpy(self, array: np.ndarray) -> Any:
        _refuse_bfloat16(array.dtype)
        with self.device, self.stream:
            return self.cp.asarray(array)

    def to_numpy(self, array: Any) -> np.ndarray:
        with self.device:
            return self.cp.asnumpy(array, stream=self.stream, blocking=True)

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
        view = object.__new__(CupyBackend)
        view.__dict__.update(self.__dict__)
        view.stream = self.cp.cuda.Stream(non_blocking=True)
        return view

    @contextlib.contextmanager
    def activate(self) -> Iterator[None]:
        """Run everything inside on this backend's device and stream."""
        with self.device, self.stream:
            yield

    def memory_stats(self) -> Any:
        return None if self.memory is None else self.memory.memory_stats()

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
            ins, outs, op = fused_kernel_source(program)
            k = self._ew[key] = self.cp.ElementwiseKernel(
                ins, outs, op, f"br_fused_{len(self._ew)}", preamble=cexpr.PREAMBLE
            )
        return k

    def _table(self, name: str) -> Any:
        from ..fusion import FusedProgram

        def run(*xs: Any) -> Any:
            names = tuple(dtypes.from_numpy(x.dtype) for x in xs)
            (spec,) = OPS[name].infer([_Spec(x.shape, n) for x, n in zip(xs, names)], {})
            refs = tuple(("in", k) for k in range(len(xs)))
            program = FusedProgram(names, ((name, refs, spec[1]),))
            return self._fused(program)(*xs)

        return run

    def _own_kernels(self) -> dict[str, Any]:
        cp = self.cp
        own = {name: self._table(name) for name in cexpr.FUSABLE if name != "cast"}

        def full(shape: Any, value: Any, dtype: str) -> Any:
            dt = dtypes.to_numpy(dtypes.normalize(dtype))
            _refuse_bfloat16(dt)
            return cp.full(tuple(shape), value, dtype=dt)

        def uniform(key: Any, shape: Any, low: float, high: float, dtype: str, stream: int):
            n = int(np.prod(shape, dtype=np.int64))
            u = uniform_bits(int(cp.asnumpy(key)), n, stream).reshape(shape)
            return cp.asarray((u * (high - low) + low).astype(dtypes.to_numpy(dtype)))

        own["full"] = full
        own["uniform"] = uniform
        return own


def _refuse_bfloat16(dtype: Any) -> None:
    if np.dtype(dtype) == dtypes.to_numpy("bfloat16"):
        raise TypeError("bfloat16 is not supported on CUDA (CuPy has no bfloat16 dtype)")
