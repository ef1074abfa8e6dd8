"""Reductions over axes, softmax forms, and matmul."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from . import dtypes
from .ops_elementwise import unbroadcast
from .registry import Builder, Handle, InferRule, Shaped, ShapeError, Spec, declare
from .shapes import broadcast, fmt, norm_axes, norm_axis, numel, reduce

REDUCE_ATTRS = {"axes": None, "keepdims": False}


def _reduce_infer(name: str, needs_float: bool = False, needs_items: bool = False) -> InferRule:
    def infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
        (x,) = xs
        axes = norm_axes(name, attrs["axes"], len(x.shape))
        if needs_float and not dtypes.is_float(x.dtype):
            raise ShapeError(f"{name}: expected a floating-point tensor, got {x.dtype}")
        if needs_items and any(x.shape[a] == 0 for a in axes):
            raise ShapeError(f"{name}: cannot reduce an empty axis of shape {fmt(x.shape)}")
        return [(reduce(x.shape, axes, attrs["keepdims"]), x.dtype)]

    if needs_float:
        infer.__doc__ = """inputs: x
        refused: `not is_float(x.dtype)`
        outputs: `reduce(x.shape, norm_axes(axes, len(x.shape)), keepdims), x.dtype`"""
    if needs_items:
        infer.__doc__ = """inputs: x
        refused: `any(a >= len(x.shape) or x.shape[a] == 0 for a in norm_axes(axes,
        len(x.shape)))`
        outputs: `reduce(x.shape, norm_axes(axes, len(x.shape)), keepdims), x.dtype`"""
    return infer


def expand_back(
    b: Builder, g: Handle, x_shape: tuple[int, ...], attrs: Mapping[str, Any]
) -> Handle:
    """Undo a reduction's shape on its gradient: reinsert reduced axes, then broadcast."""
    axes = norm_axes("grad", attrs["axes"], len(x_shape))
    kept = reduce(x_shape, axes, True)
    if g.shape != kept:
        g = b.op("reshape", g, shape=kept)
    return b.op("expand", g, shape=tuple(x_shape)) if kept != tuple(x_shape) else g


def _sum_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """inputs: x
    outputs: `reduce(x.shape, norm_axes(axes, len(x.shape)), keepdims), sum_dtype(x.dtype)`"""
    (x,) = xs
    axes = norm_axes("sum", attrs["axes"], len(x.shape))
    dt = "int64" if x.dtype in ("bool", "int8", "uint8", "int32") else x.dtype
    return [(reduce(x.shape, axes, attrs["keepdims"]), dt)]


def _sum_grad(
    b: Builder, g: Handle, xs: Sequence[Handle], out: Handle, attrs: Mapping[str, Any]
) -> Sequence[Handle | None]:
    return (expand_back(b, g, xs[0].shape, attrs),)


def _mean(
    b: Builder, x: Handle, axes: int | Sequence[int] | None = None, keepdims: bool = False
) -> Handle:
    n = numel(x.shape[i] for i in norm_axes("mean", axes, len(x.shape)))
    if not dtypes.is_float(x.dtype):
        x = b.op("cast", x, dtype=dtypes.DEFAULT_FLOAT)
    return b.op("sum", x, axes=axes, keepdims=keepdims) * (1.0 / max(n, 1))


def _var(
    b: Builder,
    x: Handle,
    axes: int | Sequence[int] | None = None,
    keepdims: bool = False,
    correction: int = 0,
) -> Handle:
    n = numel(x.shape[i] for i in norm_axes("var", axes, len(x.shape)))
    centred = x - b.op("mean", x, axes=axes, keepdims=True)
    total = b.op("sum", centred * centred, axes=axes, keepdims=keepdims)
    return total * (1.0 / max(n - correction, 1))


def _extreme_grad(
    b: Builder, g: Handle, xs: Sequence[Handle], out: Handle, attrs: Mapping[str, Any]
) -> Sequence[Handle | None]:
    (x,) = xs
    full_out = expand_back(b, out, x.shape, attrs)
    mask = b.op("cast", b.op("eq", x, full_out), dtype=x.dtype)
    count = expand_back(
        b, b.op("sum", mask, axes=attrs["axes"], keepdims=attrs["keepdims"]), x.shape, attrs
    )
    return (expand_back(b, g, x.shape, attrs) * mask / count,)


def _arg_infer(name: str) -> InferRule:
    def infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
        """inputs: x
        refused: `axis is not None and len(x.shape) > 0 and x.shape[norm_axis(axis,
        len(x.shape))] == 0`
        outputs: `((1,) * len(x.shape) if keepdims else ()) if axis is None else
        reduce(x.shape, (norm_axis(axis, len(x.shape)),), keepdims), "int64"`"""
        (x,) = xs
        if attrs["axis"] is None:
            return [((1,) * len(x.shape) if attrs["keepdims"] else (), dtypes.INDEX_DTYPE)]
        axis = norm_axis(name, attrs["axis"], len(x.shape))
        if x.shape and x.shape[axis] == 0:
            raise ShapeError(f"{name}: cannot reduce an empty axis of shape {fmt(x.shape)}")
        return [(reduce(x.shape, (axis,), attrs["keepdims"]), dtypes.INDEX_DTYPE)]

    return infer


def _lse_grad(
    b: Builder, g: Handle, xs: Sequence[Handle], out: Handle, attrs: Mapping[str, Any]
) -> Sequence[Handle | None]:
    (x,) = xs
    return (
        expand_back(b, g, x.shape, attrs) * b.op("exp", x - expand_back(b, out, x.shape, attrs)),
    )


declare("sum", "reduce", 1, attrs=REDUCE_ATTRS, infer=_sum_infer, grad=_sum_grad)
declare("mean", "reduce", 1, attrs=REDUCE_ATTRS, decompose=_mean)
declare("var", "reduce", 1, attrs={**REDUCE_ATTRS, "correction": 0}, decompose=_var)
declare(
    "max",
    "reduce",
    1,
    attrs=REDUCE_ATTRS,
    infer=_reduce_infer("max", needs_items=True),
    grad=_extreme_grad,
)
declare(
    "min",
    "reduce",
    1,
    attrs=REDUCE_ATTRS,
    infer=_reduce_infer("min", needs_items=True),
    grad=_extreme_grad,
)
declare("argmax", "reduce", 1, attrs={"axis": None, "keepdims": False}, infer=_arg_infer("argmax"))
declare("argmin", "reduce", 1, attrs={"axis": None, "keepdims": False}, infer=_arg_infer("argmin"))
declare(
    "logsumexp",
    "reduce",
    1,
    attrs=REDUCE_ATTRS,
    infer=_reduce_infer("logsumexp", needs_float=True),
    grad=_lse_grad,
)


def _softmax_infer(name: str) -> InferRule:
    def infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
        """inputs: x
        refused: `not is_float(x.dtype)`
        outputs: `k = norm_axis(axis, len(x.shape)); x.shape, x.dtype`"""
        (x,) = xs
        norm_axis(name, attrs["axis"], len(x.shape))
        if not dtypes.is_float(x.dtype):
            raise ShapeError(f"{name}: expected a floating-point tensor, got {x.dtype}")
        return [(x.shape, x.dtype)]

    return infer


def _softmax_grad(
    b: Builder, g: Handle, xs: Sequence[Handle], out: Handle, attrs: Mapping[str, Any]
) -> Sequence[Handle | None]:
    gy = g * out
    return (gy - out * b.op("sum", gy, axes=attrs["axis"], keepdims=True),)


def _log_softmax_grad(
    b: Builder, g: Handle, xs: Sequence[Handle], out: Handle, attrs: Mapping[str, Any]
) -> Sequence[Handle | None]:
    return (g - b.op("exp", out) * b.op("sum", g, axes=attrs["axis"], keepdims=True),)


declare(
    "softmax", "reduce", 1, attrs={"axis": -1}, infer=_softmax_infer("softmax"), grad=_softmax_grad
)
declare(
    "log_softmax",
    "reduce",
    1,
    attrs={"axis": -1},
    infer=_softmax_infer("log_softmax"),
    grad=_log_softmax_grad,
)


def _matmul_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """inputs: a, b
    refused: `len(a.shape) < 2 or len(b.shape) < 2 or a.shape[-1] != b.shape[-2]`
    outputs: `broadcast(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1]),
    promote(a.dtype, b.dtype)`"""
    a, b = xs
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise ShapeError(
            f"matmul: operands must be at least 2-d, got {fmt(a.shape)} and {fmt(b.shape)}"
        )
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(
            f"matmul: inner dimensions differ: {fmt(a.shape)} @ {fmt(b.shape)} "
            f"({a.shape[-1]} != {b.shape[-2]})"
        )
    batch = broadcast("matmul", a.shape[:-2], b.shape[:-2])
    return [((*batch, a.shape[-2], b.shape[-1]), dtypes.promote(a.dtype, b.dtype))]


def _swap_last(b: Builder, x: Handle) -> Handle:
    perm = (*range(len(x.shape) - 2), len(x.shape) - 1, len(x.shape) - 2)
    return b.op("permute", x, dims=perm)


def _matmul_grad(
    b: Builder, g: Handle, xs: Sequence[Handle], out: Handle, attrs: Mapping[str, Any]
) -> Sequence[Handle | None]:
    x, y = xs
    gx = b.op("matmul", g, _swap_last(b, y))
    gy = b.op("matmul", _swap_last(b, x), g)
    return unbroadcast(b, gx, x.shape), unbroadcast(b, gy, y.shape)


declare("matmul", "matmul", 2, infer=_matmul_infer, grad=_matmul_grad)
