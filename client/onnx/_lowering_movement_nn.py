"""Lowerings of movement, indexing and neural-network primitives, into the one table.

Split from `_lowering` only to keep modules short; the table (`LOWERINGS`) is the same.
Shape-valued attributes go through `Emitter.ints`, so the sizes that follow the batch are
computed at run time; sizes that ONNX takes as node attributes must be static.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from burn_remote.protocol import dtypes
from burn_remote.protocol.ops_nn import NF4_CODEBOOK, pool_params
from burn_remote.protocol.shapes import norm_axes
from onnx import TensorProto

from ._emit import INT64_MAX, INT64_MIN, Emitter, Op, static
from ._lowering_table import cast_input as _as
from ._lowering_table import lowers

# --- movement -----------------------------------------------------------------------------


@lowers("reshape")
def _reshape(e: Emitter, n: Op) -> list[str]:
    shape = n.attrs["shape"]
    zero = any(d == 0 for d in shape if isinstance(d, int))
    return [e.node("Reshape", [n.inputs[0], e.ints(shape)], allowzero=int(zero))]


@lowers("permute")
def _permute(e: Emitter, n: Op) -> list[str]:
    ndim = len(n.in_specs[0][0])
    perm = [int(d) % max(ndim, 1) for d in n.attrs["dims"]]
    return [e.node("Transpose", n.inputs, perm=perm)]


@lowers("expand")
def _expand(e: Emitter, n: Op) -> list[str]:
    return [e.node("Expand", [n.inputs[0], e.ints(n.attrs["shape"])])]


@lowers("slice")
def _slice(e: Emitter, n: Op) -> list[str]:
    """Axes taken whole are left out, so a batch axis taken whole stays dynamic for free."""
    shape = n.in_specs[0][0]
    starts, ends, axes, steps = [], [], [], []
    for axis, (a, o, s) in enumerate(zip(n.attrs["starts"], n.attrs["stops"], n.attrs["steps"])):
        if a == 0 and s == 1 and o == shape[axis]:
            continue
        if isinstance(o, int) and o < 0:  # the client's "through index 0" for negative steps
            o = INT64_MIN if s < 0 else INT64_MAX
        starts.append(a)
        ends.append(o)
        axes.append(axis)
        steps.append(s)
    if not axes:
        return [n.inputs[0]]
    args = [n.inputs[0], e.ints(starts), e.ints(ends), e.ints(axes), e.ints(steps)]
    return [e.node("Slice", args)]


@lowers("flip")
def _flip(e: Emitter, n: Op) -> list[str]:
    axes = norm_axes("flip", n.attrs["axes"], len(n.in_specs[0][0]))
    if not axes:
        return [n.inputs[0]]
    k = len(axes)
    args = [n.inputs[0], e.ints([-1] * k), e.ints([INT64_MIN] * k), e.ints(axes)]
    return [e.node("Slice", [*args, e.ints([-1] * k)])]


@lowers("cat")
def _cat(e: Emitter, n: Op) -> list[str]:
    dt = n.out_dtype
    args = [_as(e, n, k, dt) for k in range(len(n.inputs))]
    if len(args) == 1:
        return args
    return [e.node("Concat", args, axis=int(n.attrs["axis"]))]


@lowers("pad")
def _pad(e: Emitter, n: Op) -> list[str]:
    pads = n.attrs["pads"]
    if not any(p for pair in pads for p in pair):
        return [n.inputs[0]]
    widths = e.ints([p0 for p0, _ in pads] + [p1 for _, p1 in pads])
    fill = e.scalar(n.attrs["value"], n.dtype())
    return [e.node("Pad", [n.inputs[0], widths, fill], mode="constant")]


# --- indexing -----------------------------------------------------------------------------


def _index(e: Emitter, n: Op, k: int) -> str:
    dt = n.dtype(k)
    return n.inputs[k] if dt in ("int32", "int64") else e.cast(n.inputs[k], dt, "int64")


@lowers("gather")
def _gather(e: Emitter, n: Op) -> list[str]:
    axis = int(n.attrs["axis"])
    return [e.node("GatherElements", [n.inputs[0], _index(e, n, 1)], axis=axis)]


@lowers("scatter_add")
def _scatter_add(e: Emitter, n: Op) -> list[str]:
    dt = n.out_dtype
    args = [n.inputs[0], _index(e, n, 1), _as(e, n, 2, dt)]
    return [e.node("ScatterElements", args, axis=int(n.attrs["axis"]), reduction="add")]


@lowers("index_select")
def _index_select(e: Emitter, n: Op) -> list[str]:
    axis = int(n.attrs["axis"])
    return [e.node("Gather", [n.inputs[0], _index(e, n, 1)], axis=axis)]


@lowers("one_hot")
def _one_hot(e: Emitter, n: Op) -> list[str]:
    """(idx[..., None] == arange(k)): indices outside [0, k) give a zero row, as the engine."""
    idx = e.cast(n.inputs[0], n.dtype(), "int64")
    classes = e.const(np.arange(int(n.attrs["num_classes"]), dtype=np.int64))
    hit = e.node("Equal", [e.node("Unsqueeze", [idx, e.ints([-1])]), classes])
    return [e.cast(hit, "bool", n.out_dtype)]


# --- convolution and pooling ----------------------------------------------------------------


def _pair(v: int | Sequence[int]) -> list[int]:
    return [v, v] if isinstance(v, int) else list(v)


@lowers("conv2d")
def _conv2d(e: Emitter, n: Op) -> list[str]:
    dt = n.out_dtype
    ph, pw = _pair(n.attrs["padding"])
    return [
        e.node(
            "Conv",
            [_as(e, n, 0, dt), _as(e, n, 1, dt)],
            strides=static(_pair(n.attrs["stride"]), "conv2d stride"),
            pads=static([ph, pw, ph, pw], "conv2d padding"),
            dilations=static(_pair(n.attrs["dilation"]), "conv2d dilation"),
            group=int(n.attrs["groups"]),
        )
    ]


@lowers("max_pool2d", "avg_pool2d")
def _pool(e: Emitter, n: Op) -> list[str]:
    """Max pooling ignores padding (the engine pads with -inf); average counts it (zeros)."""
    (kh, kw), (sh, sw), (ph, pw) = pool_params(n.attrs)
    kernel, strides, pads = [kh, kw], [sh, sw], [ph, pw, ph, pw]
    if n.name == "max_pool2d":
        return [e.node("MaxPool", n.inputs, kernel_shape=kernel, strides=strides, pads=pads)]
    return [
        e.node(
            "AveragePool",
            n.inputs,
            kernel_shape=kernel,
            strides=strides,
            pads=pads,
            count_include_pad=1,
        )
    ]


# --- dequantisation (QLoRA base weights) ------------------------------------------------------


def _scale_blocks(e: Emitter, n: Op, values: str, divisor: float | None) -> list[str]:
    """values (flat float32) * per-block scales, reshaped to the weight's shape and dtype."""
    block = int(n.attrs["block"])
    scales = e.node("Reshape", [n.inputs[1], e.ints([-1, 1])])
    if divisor is not None:
        scales = e.node("Div", [scales, e.scalar(divisor, "float32")])
    blocks = e.node("Reshape", [values, e.ints([-1, block])])
    out = e.node("Reshape", [e.node("Mul", [blocks, scales]), e.ints(n.attrs["shape"])])
    return [e.cast(out, "float32", dtypes.normalize(n.attrs["dtype"]))]


@lowers("dequantize_int8")
def _dequantize_int8(e: Emitter, n: Op) -> list[str]:
    return _scale_blocks(e, n, e.cast(n.inputs[0], n.dtype(), "float32"), 127.0)


@lowers("dequantize_nf4")
def _dequantize_nf4(e: Emitter, n: Op) -> list[str]:
    """Two codes a byte, element 2i in the low nibble; each code picks an NF4 level."""
    packed = n.inputs[0]
    low = e.node("BitwiseAnd", [packed, e.scalar(0x0F, "uint8")])
    high = e.node("BitShift", [packed, e.scalar(4, "uint8")], direction="RIGHT")
    pairs = [e.node("Unsqueeze", [c, e.ints([1])]) for c in (low, high)]
    codes = e.node("Reshape", [e.node("Concat", pairs, axis=1), e.ints([-1])])
    levels = e.const(np.asarray(NF4_CODEBOOK, dtype=np.float32))
    values = e.node("Gather", [levels, e.node("Cast", [codes], to=TensorProto.INT64)], axis=0)
    return _scale_blocks(e, n, values, None)
