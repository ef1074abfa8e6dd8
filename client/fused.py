"""The example extension: ``linear_bias_relu``, a fused ``relu(x @ w + b)``.

It is the example of Burn 0.22's ``#[backend_extension]``: one kernel instead of three ops,
so the pre-activation never exists as a separate buffer. It shows everything an extension
declares: a shape/dtype rule (errors at the user's line), a gradient rule written over
ordinary tensor ops (so backward is recorded into the same graph), and kernels per backend.

Kernels: NumPy ("cpu"), CuPy ("cuda": the same three lines over ``cupy``) and OpenCL (the
backend's tiled GEMM, then one bias + ReLU epilogue: two launches, nothing through the
host). Servers find this module through the entry point ``fused`` of the
``burn_remote.extensions`` group.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from burn_remote.engine.extensions import per_backend
from burn_remote.protocol import dtypes
from burn_remote.protocol.registry import ShapeError
from burn_remote.protocol.shapes import fmt

from ._extension import Extension

fused = Extension("fused", version="1", doc="Fused kernels: fewer launches, fewer buffers.")


def _infer(xs: Any, attrs: Any) -> list[tuple[tuple[int, ...], str]]:
    x, w, b = xs
    if len(w.shape) != 2 or len(x.shape) < 1 or x.shape[-1] != w.shape[0]:
        raise ShapeError(
            f"linear_bias_relu: input {fmt(x.shape)} and weight {fmt(w.shape)} do not chain "
            "(expected x (..., k), w (k, n))"
        )
    if b.shape != (w.shape[1],):
        raise ShapeError(
            f"linear_bias_relu: bias {fmt(b.shape)} must be ({w.shape[1]},) for weight "
            f"{fmt(w.shape)}"
        )
    dtype = dtypes.promote(dtypes.promote(x.dtype, w.dtype), b.dtype)
    if not dtypes.is_float(dtype):
        raise ShapeError(f"linear_bias_relu: expected float operands, got {dtype}")
    return [((*x.shape[:-1], w.shape[1]), dtype)]


def _grad(b: Any, g: Any, xs: Any, out: Any, attrs: Any) -> tuple[Any, Any, Any]:
    x, w, bias = xs
    k, n = w.shape
    gz = g * (out > 0).cast(g.dtype)
    gx = gz @ w.T
    gz2 = gz.reshape(-1, n)
    gw = x.reshape(-1, k).T @ gz2
    return gx, gw, gz2.sum(axis=0)


def _kernel_numpy(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.matmul(x, w)
    out += b
    return np.maximum(out, 0, out=out)


def _kernel_cuda(x: Any, w: Any, b: Any) -> Any:
    import cupy  # type: ignore[import-not-found]

    out = cupy.matmul(x, w)
    out += b
    return cupy.maximum(out, 0, out=out)


@per_backend
def _kernel_opencl(backend: Any) -> Any:
    k = backend.kernels

    def run(x: Any, w: Any, b: Any) -> Any:
        rows = (math.prod(x.shape[:-1]), x.shape[-1])
        y = k["matmul"](k["reshape"](x, shape=rows), w)
        y = k["relu"](k["add"](y, b))  # one epilogue pass over the GEMM's output
        return y if x.ndim == 2 else k["reshape"](y, shape=(*x.shape[:-1], w.shape[1]))

    return run


linear_bias_relu = fused.op(
    "linear_bias_relu",
    arity=3,
    infer=_infer,
    grad=_grad,
    kernels={"cpu": _kernel_numpy, "cuda": _kernel_cuda, "opencl": _kernel_opencl},
    doc="relu(x @ w + b) for x (..., k), w (k, n), b (n,); one kernel, one output buffer.",
)

__all__ = ["fused", "linear_bias_relu"]
