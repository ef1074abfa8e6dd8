"""The OpenCL backend (PyOpenCL): contiguous device buffers, kernels generated per op.

Arrays are `CLArray`s: a pooled device buffer, a shape and a NumPy dtype, always C-contiguous
(reshape shares the buffer; nothing ever writes an input). Kernels are generated from the op
registry and the one C expression table (cexpr), compiled once per (source) and cached:

- elementwise, compare, where, cast: one strided kernel per (op, dtypes, rank), broadcasting
  through zero strides (opencl_codegen.elementwise_source);
- movement: permute/expand/slice/flip are views read by the same kernel; pad, cat and
  slice_backward write through a strided output view; reshape is free;
- reductions, matmul (tiled, local memory), convolution and pooling (direct), index ops,
  randomness, quantisation and the fused optimizer updates: opencl_ops.py.

No op falls back to the host. float64 needs cl_khr_fp64 (PoCL on a CPU has it).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ...protocol import dtypes
from ...protocol.registry import OPS
from ..backend_base import Backend
from .opencl_arrays import CLArray, View, view
from .opencl_codegen import elementwise_source, op_body
from .opencl_kernels import build_kernels

try:
    import pyopencl as cl
    import pyopencl.tools as cl_tools
except ImportError as exc:  # the backend module imports only where PyOpenCL is installed
    raise ImportError(
        f"PyOpenCL is not installed ({exc}); pip install 'burn-remote[opencl]'"
    ) from None


class _Spec(NamedTuple):
    shape: tuple[int, ...]
    dtype: str


def _collapse(
    shape: tuple[int, ...], strides: list[tuple[int, ...]]
) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Drop size-1 dims and merge dims every operand walks contiguously."""
    dims = [i for i, d in enumerate(shape) if d != 1]
    out_shape: list[int] = []
    out_strides: list[list[int]] = [[] for _ in strides]
    for i in dims:
        if out_shape and all(st[-1] == s[i] * shape[i] for st, s in zip(out_strides, strides)):
            out_shape[-1] *= shape[i]
            for st, s in zip(out_strides, strides):
                st[-1] = s[i]
            continue
        out_shape.append(shape[i])
        for st, s in zip(out_strides, strides):
            st.append(s[i])
    return tuple(out_shape), [tuple(s) for s in out_strides]


class OpenCLBackend(Backend):
    """One OpenCL device; `index` counts devices across all platforms (GPUs first)."""

    def __init__(self, index: int = 0) -> None:
        try:
            platforms = cl.get_platforms()
        except cl.Error as exc:
            raise RuntimeError(f"no OpenCL platform ({exc}); install pocl-opencl-icd") from None
        devices = [d for p in platforms for d in p.get_devices()]
        devices.sort(key=lambda d: 0 if d.type & cl.device_type.GPU else 1)
        if index >= len(devices):
            raise RuntimeError(f"opencl:{index}: only {len(devices)} OpenCL device(s) found")
        self.device = devices[index]
        self.name = f"opencl:{index}"
        self.fp64 = "cl_khr_fp64" in self.device.extensions
        self.context = cl.Context([self.device])
        self.queue = cl.CommandQueue(self.context)
        self.pool = cl_tools.MemoryPool(cl_tools.ImmediateAllocator(self.queue))
        self._kernels: dict[tuple[str, str], Any] = {}
        self._meta: dict[bytes, Any] = {}
        self._specs: dict[tuple[Any, ...], _Spec] = {}
        self.fusion = os.environ.get("BURN_REMOTE_FUSION", "1") != "0"
        self._dummy = cl.Buffer(self.context, cl.mem_flags.READ_ONLY, 8)
        self.kernels: dict[str, Any] = build_kernels(self)

    # --- the Backend protocol --------------------------------------------------------------
    def from_numpy(self, array: np.ndarray) -> CLArray:
        arr = np.asarray(array, order="C")
        out = self.empty(arr.shape, arr.dtype)
        if out.data is not None:
            cl.enqueue_copy(self.queue, out.data, arr.reshape(-1).view(np.uint8))
        return out

    def to_numpy(self, array: CLArray) -> np.ndarray:
        host = np.empty(array.shape, dtype=array.dtype)
        if array.data is not None:
            cl.enqueue_copy(self.queue, host.reshape(-1).view(np.uint8), array.data)
        return host

    def scalar(self, value: Any, dtype: str) -> CLArray:
        return self.from_numpy(np.asarray(value, dtype=dtypes.to_numpy(dtype)))

    def conform(self, array: Any, dtype: np.dtype) -> CLArray:
        if not isinstance(array, CLArray):
            raise TypeError(f"OpenCL kernel returned {type(array).__name__}, not a CLArray")
        return array if array.dtype == dtype else self.cast(array, dtypes.from_numpy(dtype))

    def synchronize(self) -> None:
        """Wait for every queued kernel (reads are blocking anyway)."""
        self.queue.finish()

    # --- buffers, programs, launches ---------------------------------------------------------
    def empty(self, shape: Sequence[int], dtype: Any) -> CLArray:
        dt = np.dtype(dtype)
        n = math.prod(shape) * dt.itemsize
        return CLArray(self.pool.allocate(n) if n else None, tuple(shape), dt)

    def buf(self, a: CLArray) -> Any:
        """The buffer to pass for `a` (a placeholder when `a` is empty)."""
        return a.data if a.data is not None else self._dummy

    def kernel(self, source: str, name: str) -> Any:
        """A compiled kernel, built once per distinct source."""
        key = (source, name)
        k = self._kernels.get(key)
        if k is None:
            k = self._kernels[key] = getattr(cl.Program(self.context, source).build(), name)
        return k

    def longs(self, values: Sequence[int]) -> Any:
        """A read-only device buffer of int64s, cached by content (shapes repeat)."""
        raw = np.asarray(values, dtype=np.int64).tobytes() or b"\0" * 8
        b = self._meta.get(raw)
        if b is None:
            if len(self._meta) > 4096:
                self._meta.clear()
            flags = cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR
            b = self._meta[raw] = cl.Buffer(self.context, flags, hostbuf=raw)
        return b

    def launch(self, k: Any, n: int, *args: Any, local: tuple[int, ...] | None = None) -> None:
        if n:
            k(self.queue, (n,) if isinstance(n, int) else n, local, *args)

    def elementwise(
        self,
        body: str,
        inputs: Sequence[View],
        out_dtype: str,
        value_dtype: str,
        compute: Sequence[str] | None = None,
        out: View | None = None,
        pre: Sequence[str] = (),
    ) -> CLArray:
        """Run a generated kernel computing `body` for every element of the broadcast shape
        of `inputs` (or of `out`, a strided view to write into, returned as its array)."""
        shape = out.shape if out is not None else _bshape(inputs)
        nd = len(shape)
        strides = [_bstrides(v, shape) for v in inputs]
        if out is not None:
            strides.append(out.strides)
        cshape, cstrides = _collapse(shape, strides)
        n = math.prod(shape)
        result = out.array if out is not None else self.empty(shape, dtypes.to_numpy(out_dtype))
        if n == 0:
            return result
        nd = len(cshape)
        meta = [*cshape, *(s for st in cstrides for s in st), *(v.offset for v in inputs)]
        if out is not None:
            meta.append(out.offset)
        src = elementwise_source(
            [v.array.name for v in inputs], out_dtype, body, value_dtype, nd, out is not None,
            compute, pre,
        )  # fmt: skip
        k = self.kernel(src, "ew")
        bufs = [self.buf(v.array) for v in inputs]
        self.launch(k, n, result.data, *bufs, self.longs(meta), np.int64(n))
        return result

    def op(self, name: str, *arrays: CLArray) -> CLArray:
        """A table op (cexpr) on arrays, with the registry's result dtype."""
        key = (name, *((a.shape, a.name) for a in arrays))
        spec = self._specs.get(key)
        if spec is None:
            (spec,) = [
                _Spec(*s) for s in OPS[name].shapes([_Spec(a.shape, a.name) for a in arrays], {})
            ]
            self._specs[key] = spec
        body, comp, value_dtype = op_body(name, [a.name for a in arrays], spec.dtype)
        return self.elementwise(body, [view(a) for a in arrays], spec.dtype, value_dtype, comp)

    def cast(self, a: CLArray, dtype: str) -> CLArray:
        if a.name == dtype:
            return a
        comp = "float32" if a.name in ("float16", "bfloat16") else a.name
        return self.elementwise("x0", [view(a)], dtype, comp, [comp])

    def copy(self, v: View, dtype: str | None = None) -> CLArray:
        """Materialise a view contiguously (optionally converting)."""
        return self.cast_view(v, dtype or v.array.name)

    def cast_view(self, v: View, dtype: str) -> CLArray:
        comp = "float32" if v.array.name in ("float16", "bfloat16") else v.array.name
        return self.elementwise("x0", [v], dtype, comp, [comp])

    def optimize_plan(self, plan: Any) -> Any:
        """Called once per compiled (cached) graph: fuse elementwise chains unless
        BURN_REMOTE_FUSION=0 (or `fusion` is set False)."""
        if not self.fusion:
            return plan
        from ..fusion import fuse_plan

        return fuse_plan(plan, self._fused_kernel)

    def _fused_kernel(self, program: Any) -> Any:
        from .opencl_codegen import COMPUTE

        pre = program.body(COMPUTE, lambda k: f"x{k}")
        result = f"t{len(program.instructions) - 1}"
        out_dtype = program.out_dtype
        value = "float32" if out_dtype in ("float16", "bfloat16") else out_dtype

        def run(*arrays: CLArray) -> CLArray:
            return self.elementwise(result, [view(a) for a in arrays], out_dtype, value, pre=pre)

        return run

    def fill(self, shape: Sequence[int], value: Any, dtype: str) -> CLArray:
        out = self.empty(shape, dtypes.to_numpy(dtype))
        if out.data is not None:
            pattern = np.asarray(value, dtype=dtypes.to_numpy(dtype)).reshape(1).view(np.uint8)
            cl.enqueue_fill_buffer(self.queue, out.data, pattern, 0, out.nbytes)
        return out


def _bshape(inputs: Sequence[View]) -> tuple[int, ...]:
    return tuple(np.broadcast_shapes(*(v.shape for v in inputs))) if inputs else ()


def _bstrides(v: View, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The view's strides broadcast to `shape` (zero where it repeats)."""
    lead = len(shape) - len(v.shape)
    out = [0] * lead
    for d, s, full in zip(v.shape, v.strides, shape[lead:]):
        out.append(0 if d == 1 and full != 1 else s)
    return tuple(out)


HOST_FALLBACK: dict[str, str] = {}
"""Ops that would run on the host (name -> why). Empty: every primitive has a device kernel."""
