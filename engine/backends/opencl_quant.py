"""OpenCL kernels for block quantisation (int8, NF4) and the fused optimizer updates.

Arithmetic mirrors numpy_kernels step by step in float32 (block absmax, x / absmax * 127,
round half to even; NF4 codes by counting codebook midpoints below the value), so codes are
bit-identical to the NumPy engine. Optimizer hyper-parameters are folded on the host exactly
as NumPy's weak Python scalars are (e.g. `1 - beta1` in float64, then to the param dtype).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ...protocol import dtypes
from ...protocol.ops_nn import NF4_CODEBOOK
from .opencl_arrays import CLArray
from .opencl_ops import defs

if TYPE_CHECKING:
    from .opencl_backend import OpenCLBackend

_NF4 = np.asarray(NF4_CODEBOOK, dtype=np.float32)
_MIDS = (_NF4[1:] + _NF4[:-1]) / 2


def _floats(values: np.ndarray) -> str:
    return ", ".join(f"{float(v).hex()}f" for v in values)


_QUANT = f"""
__constant float NF4[16] = {{{_floats(_NF4)}}};
__constant float MIDS[15] = {{{_floats(_MIDS)}}};
__kernel void quant(__global T_q* q, __global float* absmax, __global const T_x* x,
                    long block, long nb, int nf4) {{
    long b = get_global_id(0);
    if (b >= nb) return;
    long base = b * block;
    float m = 0;
    for (long i = 0; i < block; ++i) m = fmax(m, fabs((float)L_x(base + i)));
    absmax[b] = m;
    float safe = m > 0 ? m : 1.0f;
    if (!nf4) {{
        for (long i = 0; i < block; ++i) {{
            float t = rint((float)L_x(base + i) / safe * 127.0f);
            q[base + i] = (char)clamp(t, -127.0f, 127.0f);
        }}
        return;
    }}
    for (long i = 0; i < block; i += 2) {{
        uchar code[2];
        for (int h = 0; h < 2; ++h) {{
            float v = (float)L_x(base + i + h) / safe;
            uchar c = 0;
            for (int k = 0; k < 15; ++k) c += MIDS[k] < v;
            code[h] = c;
        }}
        q[(base + i) / 2] = (uchar)(code[0] | (code[1] << 4));
    }}
}}
__kernel void dequant(__global T_out* out, __global const T_q* q, __global const float* s,
                      long block, long n, int nf4) {{
    long i = get_global_id(0);
    if (i >= n) return;
    float scale = nf4 ? s[i / block] : s[i / block] / 127.0f;
    float v;
    if (nf4) {{ uchar byte = q[i / 2]; v = NF4[(i & 1) ? (byte >> 4) : (byte & 15)] * scale; }}
    else v = (float)q[i] * scale;
    S_out(i, v);
}}
"""


def _quant_kernels(be: OpenCLBackend) -> dict[str, Callable[..., Any]]:
    def quantize(x: CLArray, block: int, nf4: bool) -> tuple[CLArray, CLArray]:
        qt = "uint8" if nf4 else "int8"
        q = be.empty((x.size // (2 if nf4 else 1),), dtypes.to_numpy(qt))
        nb = x.size // block
        absmax = be.empty((nb,), np.float32)
        if nb:
            src = defs(be, "float32", x=(x.name, "in"), out=("float32", "out"))
            src += f"#define T_q {'uchar' if nf4 else 'char'}\n" + _QUANT
            be.launch(be.kernel(src, "quant"), nb, q.data, absmax.data, be.buf(x),
                      np.int64(block), np.int64(nb), np.int32(nf4))  # fmt: skip
        return q, absmax

    def dequantize(
        q: CLArray, scales: CLArray, block: int, shape: Any, dtype: str, nf4: bool
    ) -> CLArray:
        dt = dtypes.normalize(dtype)
        out = be.empty(tuple(shape), dtypes.to_numpy(dt))
        if out.size:
            src = defs(be, "float32", x=("float32", "in"), out=(dt, "out"))
            src += f"#define T_q {'uchar' if nf4 else 'char'}\n" + _QUANT
            be.launch(be.kernel(src, "dequant"), out.size, out.data, be.buf(q), be.buf(scales),
                      np.int64(block), np.int64(out.size), np.int32(nf4))  # fmt: skip
        return out

    return {
        "quantize_int8": lambda x, block: quantize(x, block, False),
        "quantize_nf4": lambda x, block: quantize(x, block, True),
        "dequantize_int8": lambda q, s, block, shape, dtype: dequantize(
            q, s, block, shape, dtype, False
        ),
        "dequantize_nf4": lambda q, s, block, shape, dtype: dequantize(
            q, s, block, shape, dtype, True
        ),
    }


# --- fused optimizer updates ---------------------------------------------------------------

_ADAM = """
__kernel void adam(__global T_po* po, __global T_mo* mo, __global T_vo* vo,
                   __global const T_p* p, __global const T_g* g, __global const T_m* m,
                   __global const T_v* v, __global const T_lrp* lrp, __global const T_b1p* b1p,
                   __global const T_b2p* b2p, ACC beta1, ACC one_m_beta1, ACC beta2,
                   ACC one_m_beta2, ACC eps, ACC wd, int decoupled, long n) {
    long i = get_global_id(0);
    if (i >= n) return;
    ACC lr = L_lrp(0), pv = L_p(i), gv = L_g(i);
    if (wd != 0 && !decoupled) gv = gv + wd * pv;
    ACC m2 = L_m(i) * beta1; m2 += one_m_beta1 * gv;
    ACC v2 = L_v(i) * beta2; v2 += one_m_beta2 * (gv * gv);
    ACC denom = sqrt(v2 / L_b2p(0)); denom += eps;
    ACC step = m2 / denom; step *= lr / L_b1p(0);
    ACC p2 = (wd != 0 && decoupled) ? pv * ((ACC)1 - lr * wd) : pv;
    p2 -= step;
    S_po(i, p2); S_mo(i, m2); S_vo(i, v2);
}
"""

_SGD = """
__kernel void sgd(__global T_po* po, __global T_bo* bo, __global const T_p* p,
                  __global const T_g* g, __global const T_b* b, __global const T_lrp* lrp,
                  ACC mom, ACC one_m_damp, ACC wd, int nesterov, long n) {
    long i = get_global_id(0);
    if (i >= n) return;
    ACC lr = L_lrp(0), pv = L_p(i), gv = L_g(i), step = gv;
    if (wd != 0) gv = gv + wd * pv;
    step = gv;
    if (mom != 0) {
        ACC b2 = L_b(i) * mom; b2 += one_m_damp * gv;
        step = nesterov ? gv + mom * b2 : b2;
        S_bo(i, b2);
    }
    S_po(i, pv - lr * step);
}
"""


def _optim_kernels(be: OpenCLBackend) -> dict[str, Callable[..., Any]]:
    def scalars(dt: str, *values: float) -> list[Any]:
        t = np.float64 if dt == "float64" else np.float32
        return [t(v) for v in values]

    def adam(
        p: CLArray, g: CLArray, m: CLArray, v: CLArray, lr: CLArray, bc1: CLArray,
        bc2: CLArray, beta1: float, beta2: float, eps: float, weight_decay: float,
        decoupled: bool,
    ) -> tuple[CLArray, ...]:  # fmt: skip
        acc = "float64" if p.name == "float64" else "float32"
        outs = [be.empty(a.shape, a.dtype) for a in (p, m, v)]
        if p.size:
            names = {"p": p, "g": g, "m": m, "v": v, "lrp": lr, "b1p": bc1, "b2p": bc2}
            spec = {k: (a.name, "in") for k, a in names.items()}
            spec.update(po=(p.name, "out"), mo=(m.name, "out"), vo=(v.name, "out"))
            k = be.kernel(defs(be, acc, **spec) + _ADAM, "adam")
            args = scalars(acc, beta1, 1 - beta1, beta2, 1 - beta2, eps, weight_decay)
            be.launch(k, p.size, *(o.data for o in outs), *(be.buf(a) for a in names.values()),
                      *args, np.int32(bool(decoupled)), np.int64(p.size))  # fmt: skip
        return tuple(outs)

    def sgd(
        p: CLArray, g: CLArray, buf: CLArray, lr: CLArray, momentum: float,
        dampening: float, nesterov: bool, weight_decay: float,
    ) -> tuple[CLArray, CLArray]:  # fmt: skip
        acc = "float64" if p.name == "float64" else "float32"
        po = be.empty(p.shape, p.dtype)
        bo = be.empty(buf.shape, buf.dtype) if momentum else buf
        if p.size:
            names = {"p": p, "g": g, "b": buf, "lrp": lr}
            spec = {k: (a.name, "in") for k, a in names.items()}
            spec.update(po=(p.name, "out"), bo=(buf.name, "out"))
            k = be.kernel(defs(be, acc, **spec) + _SGD, "sgd")
            args = scalars(acc, momentum, 1 - dampening, weight_decay)
            be.launch(k, p.size, po.data, be.buf(bo), *(be.buf(a) for a in names.values()),
                      *args, np.int32(bool(nesterov)), np.int64(p.size))  # fmt: skip
        return po, bo

    return {"adam_update": adam, "sgd_update": sgd}


def quant_and_optim_kernels(be: OpenCLBackend) -> dict[str, Callable[..., Any]]:
    return {**_quant_kernels(be), **_optim_kernels(be)}
