"""OpenCL kernels registered by op name: table ops, movement, reductions, matmul.

`build_kernels(backend)` returns the backend's op-name -> kernel dict; the nn, index,
randomness, quantisation and optimizer kernels come from opencl_nn.py. Kernel sources are
specialised by dtype through `#define`s built by `defs`, so each source compiles once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ...protocol import dtypes
from .opencl_arrays import TABLE_OPS, CLArray, View, contiguous_strides, view
from .opencl_codegen import COMPUTE, HEADER, STORAGE, load, store

if TYPE_CHECKING:
    from .opencl_backend import OpenCLBackend


def defs(be: OpenCLBackend, acc: str | None = None, **arrays: tuple[str, str]) -> str:
    """`#define`s for a kernel: for each name -> (dtype, role) a storage type S_<name> and
    L_<name>(i) (load, role "in") or S_<name>(i, v) store (role "out", v of dtype acc)."""
    lines = [HEADER]
    if acc is not None:
        lines.append(f"#define ACC {COMPUTE[acc]}")
    for name, (dt, role) in arrays.items():
        lines.append(f"#define T_{name} {STORAGE[dt]}")
        if role == "in":
            lines.append(f"#define L_{name}(i) {load(dt, name, '(i)', acc)}")
        else:
            lines.append(f"#define S_{name}(i, v) {store(dt, name, '(i)', '(v)', acc or dt)}")
    return "\n".join(lines) + "\n"


def acc_dtype(be: OpenCLBackend, dtype: str) -> str:
    """Accumulate floats in float64 where the device has it (more exact than NumPy's pairwise
    float32 sums, never less), integers in int64."""
    if dtypes.is_float(dtype):
        return "float64" if be.fp64 else "float32"
    return "int64"


# --- reductions ------------------------------------------------------------------------------

_ROW = """
__kernel void red(__global T_out* out, __global const T_x* x, long M, long R) {
    long m = get_global_id(0);
    if (m >= M) return;
    long base = m * R;
    BODY
}
"""

_BODIES = {
    "sum": "ACC acc = 0; for (long r = 0; r < R; ++r) acc += L_x(base + r); S_out(m, acc);",
    "max": "ACC acc = L_x(base); for (long r = 1; r < R; ++r) { ACC v = L_x(base + r); "
    "if (v > acc || v != v) acc = v; } S_out(m, acc);",
    "min": "ACC acc = L_x(base); for (long r = 1; r < R; ++r) { ACC v = L_x(base + r); "
    "if (v < acc || v != v) acc = v; } S_out(m, acc);",
    "argmax": "ACC b = L_x(base); long k = 0; for (long r = 1; r < R; ++r) { ACC v = L_x(base + r); "
    "if ((v > b || (v != v)) && b == b) { b = v; k = r; } } out[m] = k;",
    "argmin": "ACC b = L_x(base); long k = 0; for (long r = 1; r < R; ++r) { ACC v = L_x(base + r); "
    "if ((v < b || (v != v)) && b == b) { b = v; k = r; } } out[m] = k;",
    "logsumexp": "ACC mx = -INFINITY; for (long r = 0; r < R; ++r) mx = fmax(mx, (ACC)L_x(base + r)); "
    "if (!isfinite(mx)) mx = 0; ACC s = 0; for (long r = 0; r < R; ++r) s += exp(L_x(base + r) - mx); "
    "S_out(m, log(s) + mx);",
    "softmax": "ACC mx = -INFINITY; for (long r = 0; r < R; ++r) mx = fmax(mx, (ACC)L_x(base + r)); "
    "ACC s = 0; for (long r = 0; r < R; ++r) s += exp(L_x(base + r) - mx); "
    "for (long r = 0; r < R; ++r) S_out(base + r, exp(L_x(base + r) - mx) / s);",
    "log_softmax": "ACC mx = -INFINITY; for (long r = 0; r < R; ++r) mx = fmax(mx, (ACC)L_x(base + r)); "
    "ACC s = 0; for (long r = 0; r < R; ++r) s += exp(L_x(base + r) - mx); ACC ls = log(s); "
    "for (long r = 0; r < R; ++r) S_out(base + r, L_x(base + r) - mx - ls);",
}


def _axes(axes: Any, ndim: int) -> tuple[int, ...]:
    if axes is None:
        return tuple(range(ndim))
    axes = axes if isinstance(axes, tuple | list) else (axes,)
    return tuple(sorted(a % ndim for a in axes)) if ndim else ()


def _rows(be: OpenCLBackend, x: CLArray, axes: tuple[int, ...]) -> tuple[CLArray, int, int]:
    """x with the reduced axes moved last, as a contiguous (M, R) array."""
    kept = [i for i in range(x.ndim) if i not in axes]
    order = kept + list(axes)
    m = math.prod(x.shape[i] for i in kept)
    r = math.prod(x.shape[i] for i in axes)
    if order != list(range(x.ndim)):
        v = view(x)
        x = be.copy(
            View(x, tuple(x.shape[i] for i in order), tuple(v.strides[i] for i in order), 0)
        )
    return x, m, r


def _row_kernel(
    be: OpenCLBackend, kind: str, x: CLArray, m: int, r: int, out_dtype: str
) -> CLArray:
    if kind == "sum":
        acc = acc_dtype(be, x.name)
    elif kind in ("max", "min", "argmax", "argmin"):
        acc = "float32" if x.name in ("float16", "bfloat16") else x.name
    else:
        acc = "float64" if x.name == "float64" else "float32"
    n_out = m * r if kind in ("softmax", "log_softmax") else m
    out = be.empty((n_out,), dtypes.to_numpy(out_dtype))
    if m == 0 or (r == 0 and kind in ("softmax", "log_softmax")):
        return out
    src = defs(be, acc, x=(x.name, "in"), out=(out_dtype, "out")) + _ROW.replace(
        "BODY", _BODIES[kind]
    )
    be.launch(be.kernel(src, "red"), m, out.data, be.buf(x), np.int64(m), np.int64(r))
    return out


def _reduction(be: OpenCLBackend, kind: str) -> Callable[..., CLArray]:
    def run(x: CLArray, axes: Any, keepdims: bool) -> CLArray:
        ax = _axes(axes, x.ndim)
        rows, m, r = _rows(be, x, ax)
        if kind == "sum":
            out_dtype = "int64" if x.name in ("bool", "int8", "uint8", "int32") else x.name
        else:
            out_dtype = x.name
        out = _row_kernel(be, kind, rows, m, r, out_dtype)
        shape = (
            tuple(1 if i in ax else d for i, d in enumerate(x.shape))
            if keepdims
            else tuple(d for i, d in enumerate(x.shape) if i not in ax)
        )
        return CLArray(out.data, shape, out.dtype)

    return run


def _arg(be: OpenCLBackend, kind: str) -> Callable[..., CLArray]:
    def run(x: CLArray, axis: Any, keepdims: bool) -> CLArray:
        if axis is None:
            flat = CLArray(x.data, (x.size,), x.dtype)
            out = _row_kernel(be, kind, flat, 1, x.size, "int64")
            return CLArray(out.data, (1,) * x.ndim if keepdims else (), out.dtype)
        ax = axis % x.ndim
        rows, m, r = _rows(be, x, (ax,))
        out = _row_kernel(be, kind, rows, m, r, "int64")
        shape = list(x.shape)
        if keepdims:
            shape[ax] = 1
        else:
            shape.pop(ax)
        return CLArray(out.data, tuple(shape), out.dtype)

    return run


def _softmax(be: OpenCLBackend, kind: str) -> Callable[..., CLArray]:
    def run(x: CLArray, axis: int) -> CLArray:
        ax = axis % x.ndim if x.ndim else 0
        rows, m, r = _rows(be, x, (ax,) if x.ndim else ())
        out = _row_kernel(be, kind, rows, m, r, x.name)
        kept = [i for i in range(x.ndim) if i != ax]
        moved = tuple(x.shape[i] for i in kept) + ((x.shape[ax],) if x.ndim else ())
        y = CLArray(out.data, moved, out.dtype)
        if not x.ndim or ax == x.ndim - 1:
            return y
        inverse = list(range(x.ndim - 1))
        inverse.insert(ax, x.ndim - 1)
        st = contiguous_strides(moved)
        return be.copy(View(y, x.shape, tuple(st[i] for i in inverse), 0))

    return run


# --- matmul ---------------------------------------------------------------------------------

_TS = 16
_MATMUL = """
#define TS 16
__kernel void mm(__global T_out* out, __global const T_a* a, __global const T_b* b,
                 long M, long N, long K) {
    int lc = get_local_id(0), lr = get_local_id(1);
    long col = get_group_id(0) * TS + lc, row = get_group_id(1) * TS + lr;
    long bt = get_global_id(2);
    __local ACC As[TS][TS], Bs[TS][TS];
    ACC acc = 0;
    for (long t = 0; t < K; t += TS) {
        As[lr][lc] = (row < M && t + lc < K) ? L_a(bt * M * K + row * K + t + lc) : (ACC)0;
        Bs[lr][lc] = (t + lr < K && col < N) ? L_b(bt * K * N + (t + lr) * N + col) : (ACC)0;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int k = 0; k < TS; ++k) acc += As[lr][k] * Bs[k][lc];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (row < M && col < N) S_out(bt * M * N + row * N + col, acc);
}
"""


def _matmul(be: OpenCLBackend) -> Callable[..., CLArray]:
    def run(a: CLArray, b: CLArray) -> CLArray:
        out_dtype = dtypes.promote(a.name, b.name)
        batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
        m, k = a.shape[-2:]
        n = b.shape[-1]
        nb = math.prod(batch)
        a3 = _batched(be, a, batch, out_dtype)
        b3 = _batched(be, b, batch, out_dtype)
        out = be.empty((*batch, m, n), dtypes.to_numpy(out_dtype))
        if out.size == 0:
            return out
        if k == 0:
            return be.fill(out.shape, 0, out_dtype)
        acc = "float32" if out_dtype in ("float16", "bfloat16") else out_dtype
        src = defs(be, acc, a=(out_dtype, "in"), b=(out_dtype, "in"), out=(out_dtype, "out"))
        gsize = (-(-n // _TS) * _TS, -(-m // _TS) * _TS, nb)
        kern = be.kernel(src + _MATMUL, "mm")
        kern(be.queue, gsize, (_TS, _TS, 1), out.data, a3.data, b3.data,
             np.int64(m), np.int64(n), np.int64(k))  # fmt: skip
        return out

    return run


def _batched(be: OpenCLBackend, x: CLArray, batch: tuple[int, ...], dtype: str) -> CLArray:
    """x broadcast to batch + its matrix dims, contiguous and of `dtype`."""
    shape = (*batch, *x.shape[-2:])
    if x.shape == shape and x.name == dtype:
        return x
    v = view(x)
    lead = len(shape) - x.ndim
    strides = (0,) * lead + tuple(
        0 if d == 1 and shape[lead + i] != 1 else s
        for i, (d, s) in enumerate(zip(x.shape, v.strides))
    )
    return be.copy(View(x, shape, strides, 0), dtype)


# --- movement ------------------------------------------------------------------------------


def _movement(be: OpenCLBackend) -> dict[str, Callable[..., CLArray]]:
    def reshape(x: CLArray, shape: Any) -> CLArray:
        shape = list(shape)
        if -1 in shape:
            known = math.prod(d for d in shape if d != -1)
            shape[shape.index(-1)] = x.size // known if known else 0
        return CLArray(x.data, tuple(shape), x.dtype)

    def permute(x: CLArray, dims: Any) -> CLArray:
        v = view(x)
        return be.copy(
            View(x, tuple(x.shape[d] for d in dims), tuple(v.strides[d] for d in dims), 0)
        )

    def expand(x: CLArray, shape: Any) -> CLArray:
        shape = tuple(shape)
        if shape == x.shape:
            return x
        return be.copy(View(x, shape, _expand_strides(x, shape), 0))

    def slice_(x: CLArray, starts: Any, stops: Any, steps: Any) -> CLArray:
        return be.copy(_slice_view(x, x.shape, starts, stops, steps))

    def slice_backward(g: CLArray, in_shape: Any, starts: Any, stops: Any, steps: Any) -> CLArray:
        out = be.fill(tuple(in_shape), 0, g.name)
        target = _slice_view(out, out.shape, starts, stops, steps)
        return be.elementwise("x0", [view(g)], g.name, g.name, None, out=target)

    def flip(x: CLArray, axes: Any) -> CLArray:
        axes = _axes(axes, x.ndim)
        v = view(x)
        strides = list(v.strides)
        offset = 0
        for a in axes:
            if x.shape[a]:
                offset += (x.shape[a] - 1) * strides[a]
            strides[a] = -strides[a]
        return be.copy(View(x, x.shape, tuple(strides), offset))

    def pad(x: CLArray, pads: Any, value: Any) -> CLArray:
        shape = tuple(d + lo + hi for d, (lo, hi) in zip(x.shape, pads))
        out = be.fill(shape, value, x.name)
        st = contiguous_strides(shape)
        offset = sum(lo * s for (lo, _), s in zip(pads, st))
        return be.elementwise(
            "x0", [view(x)], x.name, x.name, None, out=View(out, x.shape, st, offset)
        )

    def cat(*xs: CLArray, axis: int) -> CLArray:
        axis %= xs[0].ndim
        dt = xs[0].name
        for x in xs[1:]:
            dt = dtypes.promote(dt, x.name)
        shape = list(xs[0].shape)
        shape[axis] = sum(x.shape[axis] for x in xs)
        out = be.empty(tuple(shape), dtypes.to_numpy(dt))
        st = contiguous_strides(shape)
        at = 0
        for x in xs:
            comp = "float32" if x.name in ("float16", "bfloat16") else x.name
            be.elementwise(
                "x0", [view(x)], dt, comp, [comp], out=View(out, x.shape, st, at * st[axis])
            )
            at += x.shape[axis]
        return out

    return {
        "reshape": reshape,
        "permute": permute,
        "expand": expand,
        "slice": slice_,
        "slice_backward": slice_backward,
        "flip": flip,
        "pad": pad,
        "cat": cat,
    }


def _expand_strides(x: CLArray, shape: tuple[int, ...]) -> tuple[int, ...]:
    v = view(x)
    lead = len(shape) - x.ndim
    return (0,) * lead + tuple(
        0 if d == 1 and shape[lead + i] != 1 else s
        for i, (d, s) in enumerate(zip(x.shape, v.strides))
    )


def _slice_view(x: CLArray, shape: Any, starts: Any, stops: Any, steps: Any) -> View:
    st = contiguous_strides(shape)
    out_shape, out_strides, offset = [], [], 0
    for d, s, a, o, k in zip(shape, st, starts, stops, steps):
        n = len(range(a, o if o >= 0 else -1, k)) if d else 0
        if o < 0 and k > 0:
            n = len(range(a, d, k))
        out_shape.append(n)
        out_strides.append(s * k)
        offset += a * s if n else 0
    return View(x, tuple(out_shape), tuple(out_strides), offset)


# --- the registry ----------------------------------------------------------------------------


def ops_kernels(be: OpenCLBackend) -> dict[str, Any]:
    """The elementwise, reduction, matmul and movement kernels of one OpenCL backend."""
    kernels: dict[str, Any] = {}
    for name in TABLE_OPS:
        kernels[name] = _table_kernel(be, name)
    kernels["cast"] = lambda x, dtype: be.cast(x, dtypes.normalize(dtype))
    kernels["full"] = lambda shape, value, dtype: be.fill(
        tuple(shape), value, dtypes.normalize(dtype)
    )
    for kind in ("sum", "max", "min", "logsumexp"):
        kernels[kind] = _reduction(be, kind)
    kernels["argmax"] = _arg(be, "argmax")
    kernels["argmin"] = _arg(be, "argmin")
    kernels["softmax"] = _softmax(be, "softmax")
    kernels["log_softmax"] = _softmax(be, "log_softmax")
    kernels["matmul"] = _matmul(be)
    kernels.update(_movement(be))
    return kernels


def _table_kernel(be: OpenCLBackend, name: str) -> Callable[..., CLArray]:
    def run(*xs: CLArray) -> CLArray:
        return be.op(name, *xs)

    run.__name__ = f"cl_{name}"
    return run
