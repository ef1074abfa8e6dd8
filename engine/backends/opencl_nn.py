"""OpenCL kernels for convolution, pooling, index ops, randomness, quantisation, optimizers.

Geometry travels in a small int64 parameter buffer (`p`), so one compiled source serves every
shape. Scatter-style ops (scatter_add, index_add, the pooling and convolution backwards) are
written as gathers, one work-item per output element, so they need no float atomics and
give the same sums on every device.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyopencl as cl

from ...protocol import dtypes
from ...protocol.ops_nn import pool_params
from .numpy_conv_kernels import Pair, conv_geometry
from .numpy_kernels import mix32
from .opencl_arrays import CLArray, View, view
from .opencl_ops import defs

if TYPE_CHECKING:
    from .opencl_backend import OpenCLBackend

_P = "#define P(k) p[k]\n"

_CONV = """
__kernel void conv(__global T_out* out, __global const T_x* x, __global const T_w* w,
                   __global const long* p) {
    long N = P(0), C = P(1), H = P(2), W = P(3), O = P(4), KH = P(5), KW = P(6), OH = P(7),
         OW = P(8), sh = P(9), sw = P(10), ph = P(11), pw = P(12), dh = P(13), dw = P(14),
         G = P(15);
    long cg = C / G, og = O / G;
    long gid = get_global_id(0);
    BODY
}
"""

_CONV_FWD = """
    if (gid >= N * O * OH * OW) return;
    long ox = gid % OW, oy = (gid / OW) % OH, o = (gid / (OW * OH)) % O, n = gid / (OW * OH * O);
    long g = o / og;
    ACC acc = 0;
    for (long c = 0; c < cg; ++c) for (long i = 0; i < KH; ++i) {
        long iy = oy * sh - ph + i * dh;
        if (iy < 0 || iy >= H) continue;
        for (long j = 0; j < KW; ++j) {
            long ix = ox * sw - pw + j * dw;
            if (ix < 0 || ix >= W) continue;
            acc += L_x(((n * C + g * cg + c) * H + iy) * W + ix) * L_w(((o * cg + c) * KH + i) * KW + j);
        }
    }
    S_out(gid, acc);
"""

_CONV_DX = """
    if (gid >= N * C * H * W) return;
    long xw = gid % W, xh = (gid / W) % H, c = (gid / (W * H)) % C, n = gid / (W * H * C);
    long g = c / cg, cc = c % cg;
    ACC acc = 0;
    for (long o = g * og; o < (g + 1) * og; ++o) for (long i = 0; i < KH; ++i) {
        long ty = xh + ph - i * dh;
        if (ty < 0 || ty % sh) continue;
        long oy = ty / sh;
        if (oy >= OH) continue;
        for (long j = 0; j < KW; ++j) {
            long tx = xw + pw - j * dw;
            if (tx < 0 || tx % sw) continue;
            long ox = tx / sw;
            if (ox >= OW) continue;
            acc += L_x(((n * O + o) * OH + oy) * OW + ox) * L_w(((o * cg + cc) * KH + i) * KW + j);
        }
    }
    S_out(gid, acc);
"""

_CONV_DW = """
    if (gid >= O * cg * KH * KW) return;
    long j = gid % KW, i = (gid / KW) % KH, c = (gid / (KW * KH)) % cg, o = gid / (KW * KH * cg);
    long g = o / og;
    ACC acc = 0;
    for (long n = 0; n < N; ++n) for (long oy = 0; oy < OH; ++oy) {
        long iy = oy * sh - ph + i * dh;
        if (iy < 0 || iy >= H) continue;
        for (long ox = 0; ox < OW; ++ox) {
            long ix = ox * sw - pw + j * dw;
            if (ix < 0 || ix >= W) continue;
            acc += L_x(((n * C + g * cg + c) * H + iy) * W + ix) * L_w(((n * O + o) * OH + oy) * OW + ox);
        }
    }
    S_out(gid, acc);
"""


def _acc(be: OpenCLBackend, dt: str) -> str:
    return "float64" if dt == "float64" else ("float32" if dtypes.is_float(dt) else "int64")


def _conv(be: OpenCLBackend, body: str, x: CLArray, w: CLArray, out_shape: Any, out_dtype: str,
          geo: tuple[int, ...]) -> CLArray:  # fmt: skip
    out = be.empty(tuple(out_shape), dtypes.to_numpy(out_dtype))
    if out.size == 0:
        return out
    src = defs(be, _acc(be, out_dtype), x=(x.name, "in"), w=(w.name, "in"), out=(out_dtype, "out"))
    k = be.kernel(src + _P + _CONV.replace("BODY", body), "conv")
    be.launch(k, out.size, out.data, be.buf(x), be.buf(w), be.longs(geo))
    return out


def _conv_kernels(be: OpenCLBackend) -> dict[str, Callable[..., CLArray]]:
    def geometry(
        x_shape: Sequence[int], w_shape: Sequence[int], o: int, stride: Pair, padding: Pair,
        dilation: Pair, groups: int,
    ) -> tuple[tuple[int, ...], tuple[int, int]]:  # fmt: skip
        sh, sw, ph, pw, dh, dw, kh, kw, oh, ow = conv_geometry(
            x_shape, w_shape, stride, padding, dilation
        )
        n, c, h, wd = x_shape
        return (n, c, h, wd, o, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, groups), (oh, ow)

    def conv2d(
        x: CLArray, w: CLArray, stride: Pair, padding: Pair, dilation: Pair, groups: int
    ) -> CLArray:
        geo, (oh, ow) = geometry(x.shape, w.shape, w.shape[0], stride, padding, dilation, groups)
        dt = dtypes.promote(x.name, w.name)
        return _conv(be, _CONV_FWD, x, w, (x.shape[0], w.shape[0], oh, ow), dt, geo)

    def grad_input(
        g: CLArray, w: CLArray, input_shape: Sequence[int], stride: Pair, padding: Pair,
        dilation: Pair, groups: int,
    ) -> CLArray:  # fmt: skip
        geo, _ = geometry(input_shape, w.shape, w.shape[0], stride, padding, dilation, groups)
        return _conv(be, _CONV_DX, g, w, input_shape, g.name, geo)

    def grad_weight(
        x: CLArray, g: CLArray, weight_shape: Sequence[int], stride: Pair, padding: Pair,
        dilation: Pair, groups: int,
    ) -> CLArray:  # fmt: skip
        geo, _ = geometry(x.shape, weight_shape, weight_shape[0], stride, padding, dilation, groups)
        return _conv(be, _CONV_DW, x, g, weight_shape, g.name, geo)

    return {"conv2d": conv2d, "conv2d_grad_input": grad_input, "conv2d_grad_weight": grad_weight}


# --- pooling ----------------------------------------------------------------------------------

_POOL = """
__kernel void pool(__global T_out* out, __global const T_x* x, __global const T_w* w,
                   __global const long* p) {
    long N = P(0), C = P(1), H = P(2), W = P(3), OH = P(4), OW = P(5), KH = P(6), KW = P(7),
         sh = P(8), sw = P(9), ph = P(10), pw = P(11);
    long gid = get_global_id(0);
    BODY
}
"""

# the argmax of window (oy, ox), first max wins; padding never wins (NumPy pads with the
# dtype's lowest value, which a real input can only tie, and a tie goes to the earlier one)
_WINDOW_ARGMAX = """
    ACC best = 0; long bi = -1, bj = -1;
    for (long i = 0; i < KH; ++i) for (long j = 0; j < KW; ++j) {
        long iy = oy * sh - ph + i, ix = ox * sw - pw + j;
        if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
        ACC v = L_x(base + iy * W + ix);
        if (bi < 0 || v > best || (v != v && best == best)) { best = v; bi = i; bj = j; }
    }
"""

_POOL_BODIES = {
    "max": "if (gid >= N * C * OH * OW) return;\n"
    "long ox = gid % OW, oy = (gid / OW) % OH, base = (gid / (OW * OH)) * H * W;\n"
    + _WINDOW_ARGMAX
    + "S_out(gid, best);",
    "avg": """if (gid >= N * C * OH * OW) return;
    long ox = gid % OW, oy = (gid / OW) % OH, base = (gid / (OW * OH)) * H * W;
    ACC s = 0;
    for (long i = 0; i < KH; ++i) for (long j = 0; j < KW; ++j) {
        long iy = oy * sh - ph + i, ix = ox * sw - pw + j;
        if (iy >= 0 && iy < H && ix >= 0 && ix < W) s += L_x(base + iy * W + ix);
    }
    S_out(gid, s / (ACC)(KH * KW));""",
    "max_bw": """if (gid >= N * C * H * W) return;
    long xw = gid % W, xh = (gid / W) % H, plane = gid / (W * H), base = plane * H * W;
    ACC acc = 0;
    for (long oy = 0; oy < OH; ++oy) {
        long i0 = xh + ph - oy * sh; if (i0 < 0 || i0 >= KH) continue;
        for (long ox = 0; ox < OW; ++ox) {
            long j0 = xw + pw - ox * sw; if (j0 < 0 || j0 >= KW) continue;
            """
    + _WINDOW_ARGMAX
    + """
            if (bi == i0 && bj == j0) acc += L_w((plane * OH + oy) * OW + ox);
        }
    }
    S_out(gid, acc);""",
    "avg_bw": """if (gid >= N * C * H * W) return;
    long xw = gid % W, xh = (gid / W) % H, plane = gid / (W * H);
    ACC acc = 0;
    for (long oy = 0; oy < OH; ++oy) {
        long i0 = xh + ph - oy * sh; if (i0 < 0 || i0 >= KH) continue;
        for (long ox = 0; ox < OW; ++ox) {
            long j0 = xw + pw - ox * sw; if (j0 < 0 || j0 >= KW) continue;
            acc += L_w((plane * OH + oy) * OW + ox) / (ACC)(KH * KW);
        }
    }
    S_out(gid, acc);""",
}


def _pool_kernels(be: OpenCLBackend) -> dict[str, Callable[..., CLArray]]:
    def run(
        kind: str, x: CLArray | None, g: CLArray | None, in_shape: Sequence[int],
        out_shape: Sequence[int] | None, attrs: Mapping[str, Any], dt: str,
    ) -> CLArray:  # fmt: skip
        (kh, kw), (sh, sw), (ph, pw) = pool_params(attrs)
        n, c, h, w = in_shape
        if out_shape is None:
            out_shape = (n, c, (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1)
        oh, ow = g.shape[2:] if g is not None else out_shape[2:]
        final = out_shape if kind in ("max", "avg") else in_shape
        out = be.empty(tuple(final), dtypes.to_numpy(dt))
        if out.size == 0:
            return out
        xs = x if x is not None else g
        gs = g if g is not None else xs
        if xs is None or gs is None:
            raise ValueError(f"{kind} pooling needs its input or its gradient")
        src = defs(be, _acc(be, dt), x=(xs.name, "in"), w=(gs.name, "in"), out=(dt, "out"))
        k = be.kernel(src + _P + _POOL.replace("BODY", _POOL_BODIES[kind]), "pool")
        geo = (n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw)
        be.launch(k, out.size, out.data, be.buf(xs), be.buf(gs), be.longs(geo))
        return out

    return {
        "max_pool2d": lambda x, **a: run("max", x, None, x.shape, None, a, x.name),
        "avg_pool2d": lambda x, **a: run("avg", x, None, x.shape, None, a, x.name),
        "max_pool2d_backward": lambda x, g, **a: run("max_bw", x, g, x.shape, g.shape, a, g.name),
        "avg_pool2d_backward": lambda g, input_shape, **a: run(
            "avg_bw", None, g, tuple(input_shape), g.shape, a, g.name
        ),
    }


# --- index ops ----------------------------------------------------------------------------

_INDEX = """
__kernel void idx(__global T_out* out, __global const T_x* x, __global const T_i* ix,
                  __global const T_s* s, __global const long* p, long n,
                  __global int* err) {
    long gid = get_global_id(0);
    if (gid >= n) return;
    BODY
}
"""

# p: outer, K (index count), inner, axis length of x
_SELECT = """long inner = P(2), K = P(1), D = P(3);
    long in_ = gid % inner, k = (gid / inner) % K, o = gid / (inner * K);
    long j = ix[k]; if (j < 0) j += D;
    if (j < 0 || j >= D) { err[0] = 1; return; }
    S_out(gid, L_x((o * D + j) * inner + in_));"""

# p: outer, K, inner, size (output axis length)
_INDEX_ADD = """long inner = P(2), K = P(1), D = P(3);
    long in_ = gid % inner, j = (gid / inner) % D, o = gid / (inner * D);
    ACC acc = 0;
    for (long k = 0; k < K; ++k) { long t = ix[k]; if (t < 0) t += D; if (t < 0 || t >= D) err[0] = 1; if (t == j) acc += L_x((o * K + k) * inner + in_); }
    S_out(gid, acc);"""

# p: nd, axis, x shape[nd], index shape[nd]; out has x's shape (scatter) or the index's (gather)
_ND = """long nd = P(0), axis = P(1);
    long rem = gid, xo = 0, io = 0, xs = 1, is = 1, coord_axis = 0; int inside = 1;
    for (long d = nd - 1; d >= 0; --d) {
        long dim = OUTER_SHAPE(d), c = rem % dim; rem /= dim;
        if (d == axis) coord_axis = c;
        else if (c >= P(2 + nd + d) || c >= P(2 + d)) inside = 0;
        xo += c * xs; io += c * is; xs *= P(2 + d); is *= P(2 + nd + d);
    }
    long xstride = 1, istride = 1;
    for (long d = nd - 1; d > axis; --d) { xstride *= P(2 + d); istride *= P(2 + nd + d); }
    long D = P(2 + axis);"""

_GATHER = (
    _ND.replace("OUTER_SHAPE(d)", "P(2 + nd + d)")
    + """
    long j = ix[io]; if (j < 0) j += D;
    if (j < 0 || j >= D) { err[0] = 1; return; }
    S_out(gid, L_x(xo + (j - coord_axis) * xstride));"""
)

_SCATTER = (
    _ND.replace("OUTER_SHAPE(d)", "P(2 + d)")
    + """
    ACC acc = L_x(gid);
    if (inside) {
        long ibase = io - coord_axis * istride;
        for (long k = 0; k < P(2 + nd + axis); ++k) {
            long t = ix[ibase + k * istride]; if (t < 0) t += D;
            if (t < 0 || t >= D) err[0] = 1;
            if (t == coord_axis) acc += L_s(ibase + k * istride);
        }
    }
    S_out(gid, acc);"""
)


def _index_kernels(be: OpenCLBackend) -> dict[str, Callable[..., CLArray]]:
    def run(
        body: str, out_shape: Sequence[int], dt: str, x: CLArray, idx: CLArray,
        src: CLArray | None, params: Sequence[int],
    ) -> CLArray:  # fmt: skip
        out = be.empty(tuple(out_shape), dtypes.to_numpy(dt))
        if out.size == 0:
            return out
        s = src if src is not None else x
        text = defs(be, _acc(be, dt), x=(x.name, "in"), s=(s.name, "in"), out=(dt, "out"))
        text += f"#define T_i {'long' if idx.name == 'int64' else 'int'}\n"
        if idx.name not in ("int32", "int64"):
            idx = be.cast(idx, "int64")
            text = text.replace("#define T_i int\n", "#define T_i long\n")
        k = be.kernel(text + _P + _INDEX.replace("BODY", body), "idx")
        err = be.empty((1,), np.int32)
        flag = np.zeros(1, np.int32)
        cl.enqueue_copy(be.queue, err.data, flag)
        be.launch(k, out.size, out.data, be.buf(x), be.buf(idx), be.buf(s),
                  be.longs(params), np.int64(out.size), err.data)  # fmt: skip
        cl.enqueue_copy(be.queue, flag, err.data)  # the one sync an index op costs
        if flag[0]:
            raise IndexError("an index is out of bounds for its axis")
        return out

    def index_select(x: CLArray, idx: CLArray, axis: int) -> CLArray:
        axis %= x.ndim
        outer, inner = math.prod(x.shape[:axis]), math.prod(x.shape[axis + 1 :])
        shape = (*x.shape[:axis], *idx.shape, *x.shape[axis + 1 :])
        return run(_SELECT, shape, x.name, x, idx, None, (outer, idx.size, inner, x.shape[axis]))

    def index_add(g: CLArray, idx: CLArray, axis: int, size: int) -> CLArray:
        outer = math.prod(g.shape[:axis])
        inner = math.prod(g.shape[axis + idx.ndim :])
        shape = (*g.shape[:axis], size, *g.shape[axis + idx.ndim :])
        return run(_INDEX_ADD, shape, g.name, g, idx, None, (outer, idx.size, inner, size))

    def gather(x: CLArray, idx: CLArray, axis: int) -> CLArray:
        axis %= x.ndim
        return run(_GATHER, idx.shape, x.name, x, idx, None, (x.ndim, axis, *x.shape, *idx.shape))

    def scatter_add(x: CLArray, idx: CLArray, src: CLArray, axis: int) -> CLArray:
        axis %= x.ndim
        return run(_SCATTER, x.shape, x.name, x, idx, src, (x.ndim, axis, *x.shape, *idx.shape))

    def one_hot(idx: CLArray, num_classes: int, dtype: str) -> CLArray:
        dt = dtypes.normalize(dtype)
        classes = be.from_numpy(np.arange(num_classes, dtype=np.int64))
        src = View(idx, (*idx.shape, num_classes), (*view(idx).strides, 0), 0)
        cls = View(classes, (*idx.shape, num_classes), (0,) * idx.ndim + (1,), 0)
        return be.elementwise("(x0 == x1)", [src, cls], dt, "bool", ["int64", "int64"])

    return {
        "index_select": index_select,
        "index_add": index_add,
        "gather": gather,
        "scatter_add": scatter_add,
        "one_hot": one_hot,
    }


# --- randomness ---------------------------------------------------------------------------

_UNIFORM = """
inline uint mix32(uint x) {
    x ^= x >> 16; x *= 0x7FEB352Du; x ^= x >> 15; x *= 0x846CA68Bu; x ^= x >> 16; return x;
}
__kernel void uni(__global T_out* out, uint seed, ACC low, ACC span, long n) {
    long i = get_global_id(0);
    if (i >= n) return;
    uint h = mix32((uint)i ^ seed);
    ACC u = (ACC)(h >> 8) * (ACC)5.9604644775390625e-08;
    S_out(i, u * span + low);
}
"""


def _uniform(be: OpenCLBackend) -> Callable[..., CLArray]:
    def run(
        key: CLArray, shape: Sequence[int], low: float, high: float, dtype: str, stream: int
    ) -> CLArray:
        dt = dtypes.normalize(dtype)
        k = int(be.to_numpy(key)) & 0xFFFFFFFFFFFFFFFF
        with np.errstate(over="ignore"):
            salt = mix32(np.asarray([((k >> 32) + 0x9E3779B9 * (stream + 1)) & 0xFFFFFFFF]))
            seed = int(mix32(np.asarray([k & 0xFFFFFFFF], np.uint32) ^ salt)[0])
        out = be.empty(tuple(shape), dtypes.to_numpy(dt))
        if out.size:
            acc = "float64" if be.fp64 else "float32"
            np_acc = np.float64 if be.fp64 else np.float32
            kern = be.kernel(defs(be, acc, out=(dt, "out")) + _UNIFORM, "uni")
            be.launch(kern, out.size, out.data, np.uint32(seed), np_acc(low),
                      np_acc(high - low), np.int64(out.size))  # fmt: skip
        return out

    return run


def nn_kernels(be: OpenCLBackend) -> dict[str, Callable[..., Any]]:
    """The nn, index, random, quantisation and optimizer kernels of one backend."""
    from .opencl_quant import quant_and_optim_kernels

    return {
        **_conv_kernels(be),
        **_pool_kernels(be),
        **_index_kernels(be),
        "uniform": _uniform(be),
        **quant_and_optim_kernels(be),
    }
