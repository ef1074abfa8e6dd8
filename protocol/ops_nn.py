"""Neural-network ops: convolution, pooling, normalisation, losses, randomness, quantisation.

Convolution and pooling are primitives with dedicated backward primitives (engines run them
as single kernels); normalisations and losses are compositions, so their gradients and ONNX
lowerings come from the primitives they are made of.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from . import dtypes
from .registry import (
    NOT_DIFFERENTIABLE,
    REQUIRED,
    Builder,
    Handle,
    InferRule,
    Shaped,
    ShapeError,
    Spec,
    declare,
)
from .shapes import conv_out, fmt, numel

CONV_ATTRS = {"stride": (1, 1), "padding": (0, 0), "dilation": (1, 1), "groups": 1}
POOL_ATTRS = {"kernel": REQUIRED, "stride": None, "padding": (0, 0)}

QUANT_BLOCK = 64
NF4_CODEBOOK = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
)  # fmt: skip
"""NF4 levels (QLoRA, Dettmers et al. 2023): quantiles of N(0, 1) scaled to [-1, 1]."""


def _pair(v: int | Sequence[int]) -> tuple[int, ...]:
    return (v, v) if isinstance(v, int) else tuple(v)


def _conv2d_shape(
    x_shape: Sequence[int], w_shape: Sequence[int], attrs: Mapping[str, Any]
) -> tuple[int, ...]:
    if (
        min(*_pair(attrs["stride"]), *_pair(attrs["dilation"]), attrs["groups"]) < 1
        or min(_pair(attrs["padding"])) < 0
    ):
        raise ShapeError(
            "conv2d: stride, dilation and groups must be at least 1 and padding at least 0"
        )
    n, c, h, w = x_shape
    o, cg, kh, kw = w_shape
    sh, sw = _pair(attrs["stride"])
    ph, pw = _pair(attrs["padding"])
    dh, dw = _pair(attrs["dilation"])
    groups = attrs["groups"]
    if c != cg * groups or o % groups:
        raise ShapeError(
            f"conv2d: input {fmt(x_shape)} and weight {fmt(w_shape)} disagree on channels "
            f"for groups={groups}"
        )
    oh, ow = conv_out(h, kh, sh, ph, dh), conv_out(w, kw, sw, pw, dw)
    if oh <= 0 or ow <= 0:
        raise ShapeError(f"conv2d: kernel {kh}x{kw} does not fit input {fmt(x_shape)}")
    return (n, o, oh, ow)


def _conv2d_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """inputs: x, w
    refused: `len(x.shape) != 4 or len(w.shape) != 4 or min(pair(stride) + pair(dilation) +
    (groups,)) < 1 or min(pair(padding)) < 0 or x.shape[1] != w.shape[1] * groups or
    w.shape[0] % groups != 0 or min(conv_hw(x.shape, w.shape[2:], stride, padding, dilation))
    <= 0`
    outputs: `(x.shape[0], w.shape[0]) + conv_hw(x.shape, w.shape[2:], stride, padding,
    dilation), promote(x.dtype, w.dtype)`"""
    x, w = xs
    if len(x.shape) != 4 or len(w.shape) != 4:
        raise ShapeError(
            f"conv2d: expected 4-d input and weight, got {fmt(x.shape)}, {fmt(w.shape)}"
        )
    return [(_conv2d_shape(x.shape, w.shape, attrs), dtypes.promote(x.dtype, w.dtype))]


def _conv2d_grad(
    b: Builder, g: Handle, xs: Sequence[Handle], out: Handle, attrs: Mapping[str, Any]
) -> Sequence[Handle | None]:
    x, w = xs
    gx = b.op("conv2d_grad_input", g, w, input_shape=x.shape, **attrs)
    gw = b.op("conv2d_grad_weight", x, g, weight_shape=w.shape, **attrs)
    return gx, gw


def _gradient_of(op: str, g: Shaped, forward: tuple[int, ...]) -> None:
    """A backward op's gradient must have its forward's output shape: a larger one would be
    read past, and the result written past, by a device kernel sized from the attributes."""
    if tuple(g.shape) != forward:
        raise ShapeError(f"{op}: gradient {fmt(g.shape)}, but the forward makes {fmt(forward)}")


def _conv2d_grad_input_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """inputs: g, w
    refused: `len(input_shape) != 4 or len(w.shape) != 4 or min(pair(stride) + pair(dilation) + (groups,)) < 1 or min(pair(padding)) < 0 or input_shape[1] != w.shape[1] * groups or w.shape[0] % groups != 0 or min(conv_hw(input_shape, w.shape[2:], stride, padding, dilation)) <= 0 or (input_shape[0], w.shape[0]) + conv_hw(input_shape, w.shape[2:], stride, padding, dilation) != g.shape`
    outputs: `input_shape, g.dtype`
    """  # noqa: E501
    g, w = xs
    input_shape = tuple(attrs["input_shape"])
    if len(input_shape) != 4 or len(w.shape) != 4:
        raise ShapeError(
            f"conv2d_grad_input: expected 4-d input_shape and weight, got {fmt(input_shape)}, "
            f"{fmt(w.shape)}"
        )
    _gradient_of("conv2d_grad_input", g, _conv2d_shape(input_shape, w.shape, attrs))
    return [(input_shape, g.dtype)]


def _conv2d_grad_weight_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """inputs: x, g
    refused: `len(x.shape) != 4 or len(weight_shape) != 4 or min(pair(stride) + pair(dilation) + (groups,)) < 1 or min(pair(padding)) < 0 or x.shape[1] != weight_shape[1] * groups or weight_shape[0] % groups != 0 or min(conv_hw(x.shape, weight_shape[2:], stride, padding, dilation)) <= 0 or (x.shape[0], weight_shape[0]) + conv_hw(x.shape, weight_shape[2:], stride, padding, dilation) != g.shape`
    outputs: `weight_shape, x.dtype`
    """  # noqa: E501
    x, g = xs
    weight_shape = tuple(attrs["weight_shape"])
    if len(x.shape) != 4 or len(weight_shape) != 4:
        raise ShapeError(
            f"conv2d_grad_weight: expected 4-d input and weight_shape, got {fmt(x.shape)}, "
            f"{fmt(weight_shape)}"
        )
    _gradient_of("conv2d_grad_weight", g, _conv2d_shape(x.shape, weight_shape, attrs))
    return [(weight_shape, x.dtype)]


declare("conv2d", "nn", 2, attrs=CONV_ATTRS, infer=_conv2d_infer, grad=_conv2d_grad)
declare(
    "conv2d_grad_input",
    "nn",
    2,
    attrs={"input_shape": REQUIRED, **CONV_ATTRS},
    infer=_conv2d_grad_input_infer,
    grad=NOT_DIFFERENTIABLE,
)
declare(
    "conv2d_grad_weight",
    "nn",
    2,
    attrs={"weight_shape": REQUIRED, **CONV_ATTRS},
    infer=_conv2d_grad_weight_infer,
    grad=NOT_DIFFERENTIABLE,
)


def _conv1d(
    b: Builder,
    x: Handle,
    w: Handle,
    stride: int = 1,
    padding: int = 0,
    dilation: int = 1,
    groups: int = 1,
) -> Handle:
    y = b.op(
        "conv2d",
        b.op("unsqueeze", x, axis=2),
        b.op("unsqueeze", w, axis=2),
        stride=(1, stride),
        padding=(0, padding),
        dilation=(1, dilation),
        groups=groups,
    )
    return b.op("squeeze", y, axes=(2,))


declare(
    "conv1d",
    "nn",
    2,
    attrs={"stride": 1, "padding": 0, "dilation": 1, "groups": 1},
    decompose=_conv1d,
)


def pool_params(
    attrs: Mapping[str, Any],
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    kernel = _pair(attrs["kernel"])
    stride = _pair(attrs["stride"]) if attrs["stride"] is not None else kernel
    return kernel, stride, _pair(attrs["padding"])


def _pool_infer(name: str) -> InferRule:
    def infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
        """inputs: x
        refused: `len(x.shape) != 4 or min(pair(kernel) + (pair(stride) if stride is not None
        else (1,))) < 1 or any(p < 0 or 2 * p > k for p, k in zip(pair(padding), pair(kernel)))
        or min(pool_hw(x.shape, kernel, stride, padding)) <= 0`
        outputs: `x.shape[:2] + pool_hw(x.shape, kernel, stride, padding), x.dtype`"""
        (x,) = xs
        if len(x.shape) != 4:
            raise ShapeError(f"{name}: expected a 4-d (N, C, H, W) input, got {fmt(x.shape)}")
        (kh, kw), (sh, sw), (ph, pw) = pool_params(attrs)
        if min(kh, kw, sh, sw) < 1 or min(ph, pw) < 0:
            raise ShapeError(f"{name}: kernel and stride must be at least 1, padding at least 0")
        if ph * 2 > kh or pw * 2 > kw:
            raise ShapeError(f"{name}: padding must be at most half the kernel")
        oh, ow = conv_out(x.shape[2], kh, sh, ph, 1), conv_out(x.shape[3], kw, sw, pw, 1)
        if oh <= 0 or ow <= 0:
            raise ShapeError(f"{name}: kernel {kh}x{kw} does not fit input {fmt(x.shape)}")
        return [((*x.shape[:2], oh, ow), x.dtype)]

    return infer


class _Shape:
    """A bare shape as a rule's operand (a backward rule asks its forward's rule)."""

    def __init__(self, shape: Sequence[int], dtype: str) -> None:
        self.shape, self.dtype = tuple(shape), dtype


def _max_pool2d_backward_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """inputs: x, g
    refused: `len(x.shape) != 4 or min(pair(kernel) + (pair(stride) if stride is not None else (1,))) < 1 or any(p < 0 or 2 * p > k for p, k in zip(pair(padding), pair(kernel))) or min(pool_hw(x.shape, kernel, stride, padding)) <= 0 or x.shape[:2] + pool_hw(x.shape, kernel, stride, padding) != g.shape`
    outputs: `x.shape, g.dtype`
    """  # noqa: E501
    x, g = xs
    ((forward, _),) = _pool_infer("max_pool2d_backward")([x], attrs)
    _gradient_of("max_pool2d_backward", g, forward)
    return [(x.shape, g.dtype)]


def _avg_pool2d_backward_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """inputs: g
    refused: `len(input_shape) != 4 or min(pair(kernel) + (pair(stride) if stride is not None else (1,))) < 1 or any(p < 0 or 2 * p > k for p, k in zip(pair(padding), pair(kernel))) or min(pool_hw(input_shape, kernel, stride, padding)) <= 0 or input_shape[:2] + pool_hw(input_shape, kernel, stride, padding) != g.shape`
    outputs: `input_shape, g.dtype`
    """  # noqa: E501
    (g,) = xs
    input_shape = tuple(attrs["input_shape"])
    ((forward, _),) = _pool_infer("avg_pool2d_backward")([_Shape(input_shape, g.dtype)], attrs)
    _gradient_of("avg_pool2d_backward", g, forward)
    return [(input_shape, g.dtype)]


declare(
    "max_pool2d",
    "nn",
    1,
    attrs=POOL_ATTRS,
    infer=_pool_infer("max_pool2d"),
    grad=lambda b, g, xs, out, a: (b.op("max_pool2d_backward", xs[0], g, **a),),
)
declare(
    "max_pool2d_backward",
    "nn",
    2,
    attrs=POOL_ATTRS,
    infer=_max_pool2d_backward_infer,
    grad=NOT_DIFFERENTIABLE,
    doc="Routes each output gradient to the first maximum of its window in the input x.",
)
declare(
    "avg_pool2d",
    "nn",
    1,
    attrs=POOL_ATTRS,
    infer=_pool_infer("avg_pool2d"),
    grad=lambda b, g, xs, out, a: (b.op("avg_pool2d_backward", g, input_shape=xs[0].shape, **a),),
)
declare(
    "avg_pool2d_backward",
    "nn",
    1,
    attrs={"input_shape": REQUIRED, **POOL_ATTRS},
    infer=_avg_pool2d_backward_infer,
    grad=NOT_DIFFERENTIABLE,
    doc="Spreads each output gradient evenly over its window (padding counts in the divisor).",
)


def _norm_axes(x: Handle, n_axes: int) -> tuple[int, ...]:
    return tuple(range(len(x.shape) - n_axes, len(x.shape)))


def _layer_norm(
    b: Builder,
    x: Handle,
    weight: Handle | None = None,
    bias: Handle | None = None,
    n_axes: int = 1,
    eps: float = 1e-5,
) -> Handle:
    axes = _norm_axes(x, n_axes)
    mean = b.op("mean", x, axes=axes, keepdims=True)
    centred = x - mean
    var = b.op("mean", centred * centred, axes=axes, keepdims=True)
    y = centred * b.op("rsqrt", var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def _rms_norm(
    b: Builder, x: Handle, weight: Handle | None = None, n_axes: int = 1, eps: float = 1e-6
) -> Handle:
    ms = b.op("mean", x * x, axes=_norm_axes(x, n_axes), keepdims=True)
    y = x * b.op("rsqrt", ms + eps)
    return y * weight if weight is not None else y


declare("layer_norm", "nn", None, attrs={"n_axes": 1, "eps": 1e-5}, decompose=_layer_norm)
declare("rms_norm", "nn", None, attrs={"n_axes": 1, "eps": 1e-6}, decompose=_rms_norm)
declare("embedding", "nn", 2, decompose=lambda b, w, ids: b.op("index_select", w, ids, axis=0))


def _dropout(b: Builder, x: Handle, key: Handle, p: float = 0.5) -> Handle:
    if not 0 <= p < 1:
        raise ShapeError(f"dropout: p must be in [0, 1), got {p}")
    if p == 0:
        return x
    keep = b.op("ge", b.op("uniform", key, shape=x.shape, dtype=x.dtype), b.const(p, x.dtype))
    return b.op("where", keep, x * (1.0 / (1.0 - p)), x * 0)


declare("dropout", "nn", 2, attrs={"p": 0.5}, decompose=_dropout)


def _cross_entropy_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """inputs: logits, target
    refused: `len(logits.shape) == 0 or target.shape != logits.shape[:-1] or not
    is_int(target.dtype) or not is_float(logits.dtype) or not 0.0 <= label_smoothing < 1.0`
    outputs: `(), logits.dtype`"""
    logits, target = xs
    if not logits.shape or target.shape != logits.shape[:-1]:
        raise ShapeError(
            f"cross_entropy: target {fmt(target.shape)} must be logits {fmt(logits.shape)} "
            "without its class axis"
        )
    if not dtypes.is_int(target.dtype):
        raise ShapeError(f"cross_entropy: target must hold integer classes, got {target.dtype}")
    if not dtypes.is_float(logits.dtype):
        raise ShapeError(f"cross_entropy: logits must be floating-point, got {logits.dtype}")
    if not 0.0 <= attrs["label_smoothing"] < 1.0:
        raise ShapeError(
            f"cross_entropy: label_smoothing must be in [0, 1), got {attrs['label_smoothing']}"
        )
    return [((), logits.dtype)]


def _cross_entropy_backward_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """inputs: g, logits, target
    outputs: `logits.shape, logits.dtype`"""
    return [(xs[1].shape, xs[1].dtype)]


CROSS_ENTROPY_DOC = (
    "Mean over the targets that are not ignore_index of -((1 - s) logp[target] + s mean(logp)), "
    "logp = log_softmax(logits, -1), s = label_smoothing; 0 when every target is ignored. "
    "One primitive (not a composition) because a training step calls it every time: its "
    "gradient is one more kernel (cross_entropy_backward) instead of a dozen small ones."
)
declare(
    "cross_entropy",
    "loss",
    2,
    attrs={"ignore_index": -100, "label_smoothing": 0.0},
    infer=_cross_entropy_infer,
    grad=lambda b, g, xs, out, a: (b.op("cross_entropy_backward", g, xs[0], xs[1], **a), None),
    doc=CROSS_ENTROPY_DOC,
)
declare(
    "cross_entropy_backward",
    "loss",
    3,
    attrs={"ignore_index": -100, "label_smoothing": 0.0},
    infer=_cross_entropy_backward_infer,
    grad=NOT_DIFFERENTIABLE,
    doc="d cross_entropy / d logits times the 0-d incoming gradient g: for each counted row "
    "(softmax(logits) - (1 - s) onehot(target) - s / C) g / count.",
)


def _mse(b: Builder, x: Handle, y: Handle) -> Handle:
    d = x - y
    return b.op("mean", d * d)


declare("mse_loss", "loss", 2, decompose=_mse)

# --- randomness: counter-based, so every backend draws the same numbers -------------------

RANDOM_DOC = """Counter-based: element i of stream s under key k is
h = mix32(i ^ mix32(lo32(k) ^ mix32(hi32(k) + 0x9E3779B9 * (s + 1)))), u = (h >> 8) * 2**-24,
where mix32 is the 'lowbias32' integer hash (x ^= x >> 16; x *= 0x7FEB352D; x ^= x >> 15;
x *= 0x846CA68B; x ^= x >> 16), all arithmetic modulo 2**32. u is uniform in [0, 1)."""


def _key_check(op: str, key: Shaped) -> None:
    if key.shape != () or not dtypes.is_int(key.dtype):
        raise ShapeError(
            f"{op}: key must be a 0-d integer tensor, got {fmt(key.shape)} {key.dtype}"
        )


def _uniform_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """inputs: key
    refused: `key.shape != () or not is_int(key.dtype) or not is_float(dtype)`
    outputs: `shape, dtype`"""
    _key_check("uniform", xs[0])
    dt = dtypes.normalize(attrs["dtype"])
    if not dtypes.is_float(dt):
        raise ShapeError(f"uniform: dtype must be floating-point, got {dt}")
    return [(tuple(attrs["shape"]), dt)]


declare(
    "uniform",
    "random",
    1,
    attrs={"shape": REQUIRED, "low": 0.0, "high": 1.0, "dtype": "float32", "stream": 0},
    infer=_uniform_infer,
    doc=RANDOM_DOC,
)


def _normal(
    b: Builder,
    key: Handle,
    shape: Sequence[int] = REQUIRED,
    mean: float = 0.0,
    std: float = 1.0,
    dtype: str = "float32",
) -> Handle:
    u1 = b.op("uniform", key, shape=shape, dtype="float32", stream=1)
    u2 = b.op("uniform", key, shape=shape, dtype="float32", stream=2)
    radius = b.op("sqrt", b.op("log", (1.0 - u1)) * -2.0)
    z = radius * b.op("cos", u2 * (2 * math.pi))
    z = z * std + mean
    return z if dtype == "float32" else b.op("cast", z, dtype=dtype)


def _randint(
    b: Builder,
    key: Handle,
    shape: Sequence[int] = REQUIRED,
    low: int = 0,
    high: int = REQUIRED,
    dtype: str = "int64",
) -> Handle:
    if high <= low:
        raise ShapeError(f"randint: high ({high}) must exceed low ({low})")
    u = b.op("uniform", key, shape=shape, dtype="float64", stream=3)
    return b.op("cast", b.op("floor", u * float(high - low)) + float(low), dtype=dtype)


declare(
    "normal",
    "random",
    1,
    attrs={"shape": REQUIRED, "mean": 0.0, "std": 1.0, "dtype": "float32"},
    decompose=_normal,
)
declare(
    "randint",
    "random",
    1,
    attrs={"shape": REQUIRED, "low": 0, "high": REQUIRED, "dtype": "int64"},
    decompose=_randint,
)


def _floor_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """inputs: x
    outputs: `x.shape, x.dtype`"""
    return [(xs[0].shape, xs[0].dtype)]


declare(
    "floor",
    "unary",
    1,
    infer=_floor_infer,
    grad=lambda b, g, xs, out, a: (g * 0,),
)

# --- block-wise quantisation (QLoRA) -------------------------------------------------------


def _quant_infer(name: str, code_dtype: str, per_byte: int) -> InferRule:
    def infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
        (x,) = xs
        block = attrs["block"]
        n = numel(x.shape)
        if not dtypes.is_float(x.dtype):
            raise ShapeError(f"{name}: expected a floating-point tensor, got {x.dtype}")
        if block <= 0 or n % block or block % per_byte:
            raise ShapeError(f"{name}: {n} elements do not split into blocks of {block}")
        return [((n // per_byte,), code_dtype), ((n // block,), "float32")]

    infer.__doc__ = f"""inputs: x
    refused: `not is_float(x.dtype) or block <= 0 or numel(x.shape) % block != 0 or block %
    {per_byte} != 0`
    outputs: `((numel(x.shape) // {per_byte},), "{code_dtype}"), ((numel(x.shape) // block,),
    "float32")`"""
    return infer


def _dequant_infer(name: str, per_byte: int) -> InferRule:
    def infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
        codes, scales = xs
        shape, block = tuple(attrs["shape"]), attrs["block"]
        if block <= 0:
            raise ShapeError(f"{name}: block must be positive, got {block}")
        n = numel(shape)
        if codes.shape != (n // per_byte,) or scales.shape != (n // block,):
            raise ShapeError(
                f"{name}: codes {fmt(codes.shape)} and scales {fmt(scales.shape)} do not describe "
                f"{fmt(shape)} in blocks of {block}"
            )
        return [(shape, dtypes.normalize(attrs["dtype"]))]

    infer.__doc__ = f"""inputs: codes, scales
    refused: `block <= 0 or codes.shape != (numel(shape) // {per_byte},) or scales.shape !=
    (numel(shape) // block,)`
    outputs: `shape, dtype`"""
    return infer


QUANT_ATTRS = {"block": QUANT_BLOCK}
DEQUANT_ATTRS = {"block": QUANT_BLOCK, "shape": REQUIRED, "dtype": "float32"}
declare(
    "quantize_int8",
    "quant",
    1,
    attrs=QUANT_ATTRS,
    infer=_quant_infer("quantize_int8", "int8", 1),
    grad=NOT_DIFFERENTIABLE,
    n_outputs=2,
    doc="Symmetric int8: q = round(x / absmax * 127) per block; outputs (q, absmax).",
)
declare(
    "dequantize_int8",
    "quant",
    2,
    attrs=DEQUANT_ATTRS,
    infer=_dequant_infer("dequantize_int8", 1),
    grad=NOT_DIFFERENTIABLE,
)
declare(
    "quantize_nf4",
    "quant",
    1,
    attrs=QUANT_ATTRS,
    infer=_quant_infer("quantize_nf4", "uint8", 2),
    grad=NOT_DIFFERENTIABLE,
    n_outputs=2,
    doc="NF4: nearest codebook level of x / absmax per block, two 4-bit codes a byte "
    "(element 2i in the low nibble); outputs (codes, absmax).",
)
declare(
    "dequantize_nf4",
    "quant",
    2,
    attrs=DEQUANT_ATTRS,
    infer=_dequant_infer("dequantize_nf4", 2),
    grad=NOT_DIFFERENTIABLE,
)
