"""Elementwise ops: unary math, binary arithmetic, comparisons, where, cast, constants."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from . import dtypes
from .registry import (
    REQUIRED,
    Builder,
    GradRule,
    Handle,
    InferRule,
    Shaped,
    ShapeError,
    Spec,
    declare,
)
from .shapes import broadcast


def unbroadcast(b: Builder, g: Handle, shape: Sequence[int]) -> Handle:
    """Sum a broadcast gradient back down to an operand's shape."""
    if g.shape == tuple(shape):
        return g
    lead = len(g.shape) - len(shape)
    axes = tuple(range(lead)) + tuple(
        i + lead for i, d in enumerate(shape) if d == 1 and g.shape[i + lead] != 1
    )
    if axes:
        g = b.op("sum", g, axes=axes, keepdims=True)
    return b.op("reshape", g, shape=tuple(shape)) if g.shape != tuple(shape) else g


def _float_unary(name: str) -> InferRule:
    def infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
        """inputs: x
        refused: `not is_float(x.dtype)`
        outputs: `x.shape, x.dtype`"""
        (x,) = xs
        if not dtypes.is_float(x.dtype):
            raise ShapeError(f"{name}: expected a floating-point tensor, got {x.dtype}")
        return [(x.shape, x.dtype)]

    return infer


def _same_unary(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """inputs: x
    outputs: `x.shape, x.dtype`"""
    (x,) = xs
    return [(x.shape, x.dtype)]


def _binary(name: str) -> InferRule:
    def infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
        """inputs: a, b
        outputs: `broadcast(a.shape, b.shape), promote(a.dtype, b.dtype)`"""
        a, b = xs
        return [(broadcast(name, a.shape, b.shape), dtypes.promote(a.dtype, b.dtype))]

    return infer


def _compare(name: str) -> InferRule:
    def infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
        """inputs: a, b
        outputs: `broadcast(a.shape, b.shape), "bool"`"""
        a, b = xs
        return [(broadcast(name, a.shape, b.shape), "bool")]

    return infer


# --- unary ------------------------------------------------------------------------------

declare("neg", "unary", 1, infer=_same_unary, grad=lambda b, g, xs, out, a: (-g,))
declare(
    "abs", "unary", 1, infer=_same_unary, grad=lambda b, g, xs, out, a: (g * b.op("sign", xs[0]),)
)
declare("sign", "unary", 1, infer=_same_unary, grad=lambda b, g, xs, out, a: (g * 0,))
declare("exp", "unary", 1, infer=_float_unary("exp"), grad=lambda b, g, xs, out, a: (g * out,))
declare("log", "unary", 1, infer=_float_unary("log"), grad=lambda b, g, xs, out, a: (g / xs[0],))
declare(
    "sqrt", "unary", 1, infer=_float_unary("sqrt"), grad=lambda b, g, xs, out, a: (g * 0.5 / out,)
)
declare(
    "rsqrt",
    "unary",
    1,
    infer=_float_unary("rsqrt"),
    grad=lambda b, g, xs, out, a: (g * -0.5 * out * out * out,),
)
declare(
    "sin",
    "unary",
    1,
    infer=_float_unary("sin"),
    grad=lambda b, g, xs, out, a: (g * b.op("cos", xs[0]),),
)
declare(
    "cos",
    "unary",
    1,
    infer=_float_unary("cos"),
    grad=lambda b, g, xs, out, a: (-g * b.op("sin", xs[0]),),
)
declare(
    "tanh",
    "unary",
    1,
    infer=_float_unary("tanh"),
    grad=lambda b, g, xs, out, a: (g * (1 - out * out),),
)
declare(
    "sigmoid",
    "unary",
    1,
    infer=_float_unary("sigmoid"),
    grad=lambda b, g, xs, out, a: (g * out * (1 - out),),
)
declare(
    "relu",
    "unary",
    1,
    infer=_same_unary,
    grad=lambda b, g, xs, out, a: (
        b.op("where", b.op("gt", xs[0], b.const(0, xs[0].dtype)), g, b.const(0, g.dtype)),
    ),
)
declare(
    "softplus",
    "unary",
    1,
    infer=_float_unary("softplus"),
    grad=lambda b, g, xs, out, a: (g * b.op("sigmoid", xs[0]),),
)
declare(
    "erf",
    "unary",
    1,
    infer=_float_unary("erf"),
    grad=lambda b, g, xs, out, a: (g * (2 / math.sqrt(math.pi)) * b.op("exp", -(xs[0] * xs[0])),),
)


def _gelu(b: Builder, x: Handle, approximate: str = "none") -> Handle:
    if approximate == "tanh":
        inner = (x + x * x * x * 0.044715) * math.sqrt(2 / math.pi)
        return x * 0.5 * (b.op("tanh", inner) + 1)
    if approximate != "none":
        raise ShapeError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return x * 0.5 * (b.op("erf", x * (1 / math.sqrt(2))) + 1)


declare("gelu", "unary", 1, attrs={"approximate": "none"}, decompose=_gelu)
declare("silu", "unary", 1, decompose=lambda b, x: x * b.op("sigmoid", x))

# --- binary -----------------------------------------------------------------------------


def _add_grad(
    b: Builder, g: Handle, xs: Sequence[Handle], out: Handle, a: Mapping[str, Any]
) -> Sequence[Handle | None]:
    return unbroadcast(b, g, xs[0].shape), unbroadcast(b, g, xs[1].shape)


def _sub_grad(
    b: Builder, g: Handle, xs: Sequence[Handle], out: Handle, a: Mapping[str, Any]
) -> Sequence[Handle | None]:
    return unbroadcast(b, g, xs[0].shape), unbroadcast(b, -g, xs[1].shape)


def _mul_grad(
    b: Builder, g: Handle, xs: Sequence[Handle], out: Handle, a: Mapping[str, Any]
) -> Sequence[Handle | None]:
    x, y = xs
    return unbroadcast(b, g * y, x.shape), unbroadcast(b, g * x, y.shape)


def _div_grad(
    b: Builder, g: Handle, xs: Sequence[Handle], out: Handle, a: Mapping[str, Any]
) -> Sequence[Handle | None]:
    x, y = xs
    gx = g / y
    return unbroadcast(b, gx, x.shape), unbroadcast(b, -gx * out, y.shape)


def _pow_grad(
    b: Builder, g: Handle, xs: Sequence[Handle], out: Handle, a: Mapping[str, Any]
) -> Sequence[Handle | None]:
    x, y = xs
    gx = g * y * b.op("pow", x, y - 1)
    safe = b.op("where", b.op("gt", x, b.const(0, x.dtype)), x, b.const(1, x.dtype))
    gy = g * out * b.op("log", safe)
    return unbroadcast(b, gx, x.shape), unbroadcast(b, gy, y.shape)


def _minmax_grad(pick: str) -> GradRule:
    def grad(
        b: Builder, g: Handle, xs: Sequence[Handle], out: Handle, a: Mapping[str, Any]
    ) -> Sequence[Handle | None]:
        x, y = xs
        take_x = b.op(pick, x, y)
        zero = g * 0
        return (
            unbroadcast(b, b.op("where", take_x, g, zero), x.shape),
            unbroadcast(b, b.op("where", take_x, zero, g), y.shape),
        )

    return grad


declare("add", "binary", 2, infer=_binary("add"), grad=_add_grad)
declare("sub", "binary", 2, infer=_binary("sub"), grad=_sub_grad)
declare("mul", "binary", 2, infer=_binary("mul"), grad=_mul_grad)
declare("div", "binary", 2, infer=_binary("div"), grad=_div_grad)
declare("pow", "binary", 2, infer=_binary("pow"), grad=_pow_grad)
declare("maximum", "binary", 2, infer=_binary("maximum"), grad=_minmax_grad("ge"))
declare("minimum", "binary", 2, infer=_binary("minimum"), grad=_minmax_grad("le"))

for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    declare(_name, "compare", 2, infer=_compare(_name))
declare("logical_and", "compare", 2, infer=_compare("logical_and"))
declare("logical_or", "compare", 2, infer=_compare("logical_or"))


def _logical_not_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """inputs: x
    outputs: `x.shape, "bool"`"""
    return [(xs[0].shape, "bool")]


declare("logical_not", "compare", 1, infer=_logical_not_infer)

# --- selection, conversion, constants -------------------------------------------------


def _where_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """inputs: c, x, y
    refused: `c.dtype != "bool"`
    outputs: `broadcast(c.shape, x.shape, y.shape), promote(x.dtype, y.dtype)`"""
    c, x, y = xs
    if c.dtype != "bool":
        raise ShapeError(f"where: condition must be bool, got {c.dtype}")
    return [(broadcast("where", c.shape, x.shape, y.shape), dtypes.promote(x.dtype, y.dtype))]


def _where_grad(
    b: Builder, g: Handle, xs: Sequence[Handle], out: Handle, a: Mapping[str, Any]
) -> Sequence[Handle | None]:
    c, x, y = xs
    zero = b.const(0, g.dtype)  # PyTorch's rule: 0 where not picked, even under a NaN gradient
    return (
        None,
        unbroadcast(b, b.op("where", c, g, zero), x.shape),
        unbroadcast(b, b.op("where", c, zero, g), y.shape),
    )


declare("where", "select", 3, infer=_where_infer, grad=_where_grad)


def _clamp(b: Builder, x: Handle, min: float | None = None, max: float | None = None) -> Handle:
    if min is not None:
        x = b.op("maximum", x, b.const(min, x.dtype))
    if max is not None:
        x = b.op("minimum", x, b.const(max, x.dtype))
    return x


declare("clamp", "select", 1, attrs={"min": None, "max": None}, decompose=_clamp)


def _cast_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """inputs: x
    outputs: `x.shape, dtype`"""
    return [(xs[0].shape, dtypes.normalize(attrs["dtype"]))]


def _cast_grad(
    b: Builder, g: Handle, xs: Sequence[Handle], out: Handle, a: Mapping[str, Any]
) -> Sequence[Handle | None]:
    if not dtypes.is_float(xs[0].dtype):
        return (None,)
    return (b.op("cast", g, dtype=xs[0].dtype),)


declare("cast", "convert", 1, attrs={"dtype": REQUIRED}, infer=_cast_infer, grad=_cast_grad)


def _full_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """inputs: (none)
    refused: `any(d < 0 for d in shape)`
    outputs: `shape, dtype`"""
    shape = tuple(attrs["shape"])
    if any(d < 0 for d in shape):
        raise ShapeError(f"full: negative dimension in {shape}")
    return [(shape, dtypes.normalize(attrs["dtype"]))]


def _value_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """inputs: (none)
    outputs: `(), dtype`"""
    return [((), dtypes.normalize(attrs["dtype"]))]


declare(
    "full",
    "creation",
    0,
    attrs={"shape": REQUIRED, "value": REQUIRED, "dtype": REQUIRED},
    infer=_full_infer,
    doc="A constant: its value is part of the graph's structure (and hash).",
)
declare(
    "value",
    "creation",
    0,
    attrs={"dtype": REQUIRED},
    infer=_value_infer,
    doc="A 0-d scalar bound at execution time: its value is a binding, not part of the hash.",
)
