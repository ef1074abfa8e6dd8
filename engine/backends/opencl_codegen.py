"""OpenCL C generation: dtype spellings, loads and stores, and the strided elementwise kernel.

Every OpenCL array is a contiguous buffer; operands are read through (shape, strides, offset)
views, so broadcasting and the movement ops (permute, expand, slice, flip) are index mapping
in the one generated elementwise kernel rather than copies on the host.

float16 is stored as `half` and moved with `vload_half`/`vstore_half_rte` (core OpenCL, no
cl_khr_fp16 needed); bfloat16 is stored as `ushort` and widened by a shift, narrowed with
round-to-nearest-even. Both compute in float32, as cexpr.compute_dtype says.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...protocol import dtypes
from . import cexpr

STORAGE = {
    "bool": "uchar",
    "int8": "char",
    "uint8": "uchar",
    "int32": "int",
    "int64": "long",
    "float16": "half",
    "bfloat16": "ushort",
    "float32": "float",
    "float64": "double",
}
"""OpenCL C type of each wire dtype's buffer element."""

COMPUTE = {**STORAGE, "float16": "float", "bfloat16": "float"}
"""OpenCL C type values of each dtype are computed in."""

HEADER = (
    """
#ifdef cl_khr_fp64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
inline float br_bf16_load(ushort v) { return as_float(((uint)v) << 16); }
inline ushort br_bf16_store(float f) {
    uint u = as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (ushort)(u >> 16);
}
"""
    + cexpr.PREAMBLE
)
"""Prepended to every program: fp64 when the device has it, bfloat16 helpers, cexpr helpers."""


def load(dtype: str, ptr: str, index: str, to: str | None = None) -> str:
    """C expression reading element `index` of `ptr`, converted to dtype `to` (default: the
    dtype's compute type)."""
    if dtype == "float16":
        expr = f"vload_half({index}, {ptr})"
    elif dtype == "bfloat16":
        expr = f"br_bf16_load({ptr}[{index}])"
    else:
        expr = f"{ptr}[{index}]"
    target = COMPUTE[to or dtype]
    return expr if target == COMPUTE[dtype] else f"(({target})({expr}))"


def store(dtype: str, ptr: str, index: str, value: str, value_dtype: str) -> str:
    """C statement writing `value` (of dtype `value_dtype`) as element `index` of `ptr`,
    converting like NumPy's astype (float to small ints goes through int, as on x86)."""
    if dtype == "bool":
        return f"{ptr}[{index}] = (uchar)(({value}) != 0);"
    if dtype == "float16":
        v = value if dtypes.is_float(value_dtype) else f"(float)({value})"
        return f"vstore_half_rte({v}, {index}, {ptr});"
    if dtype == "bfloat16":
        return f"{ptr}[{index}] = br_bf16_store((float)({value}));"
    if dtype in ("int8", "uint8") and dtypes.is_float(value_dtype):
        return f"{ptr}[{index}] = ({STORAGE[dtype]})(int)({value});"
    return f"{ptr}[{index}] = ({STORAGE[dtype]})({value});"


def elementwise_source(
    in_dtypes: Sequence[str],
    out_dtype: str,
    body: str,
    value_dtype: str,
    nd: int,
    out_strided: bool,
    compute: Sequence[str] | None = None,
    pre: Sequence[str] = (),
) -> str:
    """A kernel `ew(out, in0.., meta, n)` computing `body` (over `x0`, `x1`, ... already
    loaded in their `compute` dtypes, after the statements `pre`) for each of n output elements.

    meta holds, as longs: the nd-dim shape, nd strides per input (and for the output when
    `out_strided`), then one element offset per input and for the output.
    """
    k = len(in_dtypes)
    computes: list[str | None] = list(compute) if compute is not None else [None] * k
    args = [f"__global {STORAGE[out_dtype]}* out"]
    args += [f"__global const {STORAGE[d]}* in{i}" for i, d in enumerate(in_dtypes)]
    args += ["__global const long* meta", "long n"]
    n_strided = k + (1 if out_strided else 0)
    off = nd * (1 + n_strided)
    lines = ["long gid = get_global_id(0);", "if (gid >= n) return;"]
    for i in range(k):
        lines.append(f"long o{i} = meta[{off + i}];")
    lines.append(f"long oo = meta[{off + k}];" if out_strided else "long oo = gid;")
    if nd:
        lines.append("long rem = gid;")
        lines.append(f"for (int d = {nd - 1}; d >= 0; --d) {{")
        lines.append("  long s = meta[d]; long idx = rem % s; rem /= s;")
        for i in range(k):
            lines.append(f"  o{i} += idx * meta[{nd * (1 + i)} + d];")
        if out_strided:
            lines.append(f"  oo += idx * meta[{nd * (1 + k)} + d];")
        lines.append("}")
    for i, d in enumerate(in_dtypes):
        c = computes[i] or d
        lines.append(f"{COMPUTE[c]} x{i} = {load(d, f'in{i}', f'o{i}', c)};")
    lines.extend(pre)
    lines.append(store(out_dtype, "out", "oo", body, value_dtype))
    inner = "\n    ".join(lines)
    return f"{HEADER}\n__kernel void ew({', '.join(args)}) {{\n    {inner}\n}}\n"


def op_body(op: str, in_dtypes: Sequence[str], out_dtype: str) -> tuple[str, list[str], str]:
    """(C body over x0.., the compute dtype of each operand, the body's dtype) for a table op."""
    comp = list(cexpr.compute_dtype(op, tuple(in_dtypes), out_dtype))
    names = tuple(f"x{i}" for i in range(len(in_dtypes)))
    c = comp[-1] if op == "where" else comp[0]
    body = cexpr.expression(op, c, COMPUTE[c], names)
    value_dtype = "bool" if op in cexpr.COMPARE else c
    return body, comp, value_dtype
