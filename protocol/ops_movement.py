"""Movement and indexing ops: reshape, permute, expand, slice, cat, flip, pad, gathers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from . import dtypes
from .ops_elementwise import unbroadcast
from .registry import REQUIRED, Builder, Handle, Shaped, ShapeError, Spec, declare
from .shapes import fmt, norm_axes, norm_axis, numel, slice_len


def _reshape_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """inputs: x
    refused: `numel(resolve(shape, numel(x.shape))) != numel(x.shape)`
    outputs: `resolve(shape, numel(x.shape)), x.dtype`"""
    (x,) = xs
    shape = tuple(attrs["shape"])
    if shape.count(-1) > 1:
        raise ShapeError(f"reshape: at most one -1 allowed in {shape}")
    if -1 in shape:
        rest = numel(d for d in shape if d != -1)
        if rest == 0 or numel(x.shape) % rest:
            raise ShapeError(f"reshape: cannot reshape {fmt(x.shape)} into {shape}")
        shape = tuple(numel(x.shape) // rest if d == -1 else d for d in shape)
    if numel(shape) != numel(x.shape):
        raise ShapeError(
            f"reshape: cannot reshape {fmt(x.shape)} ({numel(x.shape)} elements) into {fmt(shape)}"
        )
    return [(shape, x.dtype)]


declare(
    "reshape",
    "movement",
    1,
    attrs={"shape": REQUIRED},
    infer=_reshape_infer,
    grad=lambda b, g, xs, out, a: (b.op("reshape", g, shape=xs[0].shape),),
)


def _permute_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """inputs: x
    refused: `sorted(norm_axis(d, len(x.shape)) for d in dims) != list(range(len(x.shape)))`
    outputs: `tuple(x.shape[d] for d in dims), x.dtype`"""
    (x,) = xs
    dims = tuple(attrs["dims"])
    if sorted(d % max(len(x.shape), 1) for d in dims) != list(range(len(x.shape))):
        raise ShapeError(f"permute: {dims} is not a permutation of the axes of {fmt(x.shape)}")
    return [(tuple(x.shape[d] for d in dims), x.dtype)]


def _permute_grad(
    b: Builder, g: Handle, xs: Sequence[Handle], out: Handle, attrs: Mapping[str, Any]
) -> Sequence[Handle | None]:
    dims = [d % len(xs[0].shape) for d in attrs["dims"]]
    inverse = tuple(sorted(range(len(dims)), key=dims.__getitem__))
    return (b.op("permute", g, dims=inverse),)


declare(
    "permute", "movement", 1, attrs={"dims": REQUIRED}, infer=_permute_infer, grad=_permute_grad
)


def _transpose(b: Builder, x: Handle, dim0: int = -2, dim1: int = -1) -> Handle:
    n = len(x.shape)
    d0, d1 = norm_axis("transpose", dim0, n), norm_axis("transpose", dim1, n)
    dims = list(range(n))
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return b.op("permute", x, dims=tuple(dims))


declare("transpose", "movement", 1, attrs={"dim0": -2, "dim1": -1}, decompose=_transpose)


def _expand_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """inputs: x
    refused: `len(shape) < len(x.shape) or any(d != 1 and d != shape[len(shape) - len(x.shape)
    + i] for i, d in enumerate(x.shape))`
    outputs: `shape, x.dtype`"""
    (x,) = xs
    shape = tuple(attrs["shape"])
    if len(shape) < len(x.shape):
        raise ShapeError(f"expand: cannot expand {fmt(x.shape)} to fewer dims {fmt(shape)}")
    lead = len(shape) - len(x.shape)
    for i, d in enumerate(x.shape):
        if d != 1 and d != shape[lead + i]:
            raise ShapeError(f"expand: cannot expand {fmt(x.shape)} to {fmt(shape)}")
    return [(shape, x.dtype)]


declare(
    "expand",
    "movement",
    1,
    attrs={"shape": REQUIRED},
    infer=_expand_infer,
    grad=lambda b, g, xs, out, a: (unbroadcast(b, g, xs[0].shape),),
)


def _squeeze(b: Builder, x: Handle, axes: int | Sequence[int] | None = None) -> Handle:
    if axes is None:
        axes = tuple(i for i, d in enumerate(x.shape) if d == 1)
    axes = norm_axes("squeeze", axes, len(x.shape))
    for a in axes:
        if x.shape[a] != 1:
            raise ShapeError(f"squeeze: axis {a} of {fmt(x.shape)} has size {x.shape[a]}, not 1")
    return b.op("reshape", x, shape=tuple(d for i, d in enumerate(x.shape) if i not in axes))


def _unsqueeze(b: Builder, x: Handle, axis: int = REQUIRED) -> Handle:
    n = len(x.shape) + 1
    axis = norm_axis("unsqueeze", axis, n)
    shape = list(x.shape)
    shape.insert(axis, 1)
    return b.op("reshape", x, shape=tuple(shape))


declare("squeeze", "movement", 1, attrs={"axes": None}, decompose=_squeeze)
declare("unsqueeze", "movement", 1, attrs={"axis": REQUIRED}, decompose=_unsqueeze)


def _slice_out(op: str, shape: tuple[int, ...], attrs: Mapping[str, Any]) -> tuple[int, ...]:
    """The shape a slice of ``shape`` makes; refuses bounds that are not clamped."""
    starts, stops, steps = attrs["starts"], attrs["stops"], attrs["steps"]
    if not len(starts) == len(stops) == len(steps) == len(shape):
        raise ShapeError(f"{op}: need one start/stop/step per axis of {fmt(shape)}")
    if any(s == 0 for s in steps):
        raise ShapeError(f"{op}: step cannot be zero")
    for axis, (a, o, t, n) in enumerate(zip(starts, stops, steps, shape)):
        lo, hi = (0, n) if t > 0 else (-1, n - 1)
        if not (lo <= a <= hi and lo <= o <= hi):
            raise ShapeError(
                f"{op}: axis {axis} of {fmt(shape)}: start {a} and stop {o} must lie in "
                f"[{lo}, {hi}] for step {t} (bounds clamped as slice.indices clamps them)"
            )
    return tuple(slice_len(a, o, t) for a, o, t in zip(starts, stops, steps))


def _slice_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """`starts`, `stops`, `steps`: one entry per axis, clamped by the client as Python's
    `slice(...).indices(n)` clamps (a bound outside that range would make an output larger
    than the input, which a kernel would fill by reading past it: refused).

    inputs: x
    refused: `not len(starts) == len(stops) == len(steps) == len(x.shape) or 0 in steps or not all(lo <= a <= hi and lo <= o <= hi for a, o, t, n in zip(starts, stops, steps, x.shape) for lo, hi in [(0, n) if t > 0 else (-1, n - 1)])`
    outputs: `tuple(slice_len(a, o, t) for a, o, t in zip(starts, stops, steps)), x.dtype`
    """  # noqa: E501
    (x,) = xs
    return [(_slice_out("slice", tuple(x.shape), attrs), x.dtype)]


def _slice_grad(
    b: Builder, g: Handle, xs: Sequence[Handle], out: Handle, attrs: Mapping[str, Any]
) -> Sequence[Handle | None]:
    return (b.op("slice_backward", g, in_shape=xs[0].shape, **attrs),)


SLICE_ATTRS = {"starts": REQUIRED, "stops": REQUIRED, "steps": REQUIRED}
declare("slice", "movement", 1, attrs=SLICE_ATTRS, infer=_slice_infer, grad=_slice_grad)


def _slice_backward_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """The gradient of a slice, scattered back into `in_shape`: `g` must have the shape that
    slice of `in_shape` makes (else the scatter would write past its output).

    inputs: g
    refused: `not len(starts) == len(stops) == len(steps) == len(in_shape) or 0 in steps or not all(lo <= a <= hi and lo <= o <= hi for a, o, t, n in zip(starts, stops, steps, in_shape) for lo, hi in [(0, n) if t > 0 else (-1, n - 1)]) or tuple(slice_len(a, o, t) for a, o, t in zip(starts, stops, steps)) != g.shape`
    outputs: `in_shape, g.dtype`
    """  # noqa: E501
    (g,) = xs
    in_shape = tuple(attrs["in_shape"])
    want = _slice_out("slice_backward", in_shape, attrs)
    if tuple(g.shape) != want:
        raise ShapeError(
            f"slice_backward: gradient {fmt(g.shape)}, but that slice of {fmt(in_shape)} "
            f"is {fmt(want)}"
        )
    return [(in_shape, g.dtype)]


declare(
    "slice_backward",
    "movement",
    1,
    attrs={"in_shape": REQUIRED, **SLICE_ATTRS},
    infer=_slice_backward_infer,
    grad=lambda b, g, xs, out, a: (
        b.op("slice", g, starts=a["starts"], stops=a["stops"], steps=a["steps"]),
    ),
    doc="Zeros of in_shape with the gradient written into the sliced region.",
)


def _cat_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """inputs: xs (one or more)
    refused: `k = norm_axis(axis, len(xs[0].shape)); len(xs[0].shape) == 0 or any(len(t.shape)
    != len(xs[0].shape) or any(t.shape[i] != xs[0].shape[i] for i in range(len(t.shape)) if i
    != k) for t in xs)`
    outputs: `xs[0].shape[:k] + (sum(t.shape[k] for t in xs),) + xs[0].shape[k + 1 :],
    promote(*(t.dtype for t in xs))`"""
    if not xs:
        raise ShapeError("cat: needs at least one tensor")
    first = xs[0]
    axis = norm_axis("cat", attrs["axis"], len(first.shape))
    total = 0
    dtype = first.dtype
    for x in xs:
        if len(x.shape) != len(first.shape) or any(
            d != e for i, (d, e) in enumerate(zip(x.shape, first.shape)) if i != axis
        ):
            raise ShapeError(
                f"cat: shapes {', '.join(fmt(t.shape) for t in xs)} differ outside axis {axis}"
            )
        total += x.shape[axis]
        dtype = dtypes.promote(dtype, x.dtype)
    shape = list(first.shape)
    shape[axis] = total
    return [(tuple(shape), dtype)]


def _cat_grad(
    b: Builder, g: Handle, xs: Sequence[Handle], out: Handle, attrs: Mapping[str, Any]
) -> Sequence[Handle | None]:
    axis = norm_axis("cat", attrs["axis"], len(out.shape))
    grads, offset = [], 0
    for x in xs:
        starts = [0] * len(out.shape)
        stops = list(out.shape)
        starts[axis], stops[axis] = offset, offset + x.shape[axis]
        offset += x.shape[axis]
        grads.append(
            b.op("slice", g, starts=tuple(starts), stops=tuple(stops), steps=(1,) * len(out.shape))
        )
    return grads


declare("cat", "movement", None, attrs={"axis": 0}, infer=_cat_infer, grad=_cat_grad)


def _stack(b: Builder, *xs: Handle, axis: int = 0) -> Handle:
    if not xs:
        raise ShapeError("stack: needs at least one tensor")
    return b.op("cat", *(b.op("unsqueeze", x, axis=axis) for x in xs), axis=axis)


declare("stack", "movement", None, attrs={"axis": 0}, decompose=_stack)


def _split(
    b: Builder, x: Handle, sizes: int | Sequence[int] = REQUIRED, axis: int = 0
) -> tuple[Handle, ...]:
    axis = norm_axis("split", axis, len(x.shape))
    if isinstance(sizes, int):
        n = x.shape[axis]
        sizes = [sizes] * (n // sizes) + ([n % sizes] if n % sizes else [])
    if sum(sizes) != x.shape[axis]:
        raise ShapeError(f"split: sizes {tuple(sizes)} do not add up to {x.shape[axis]}")
    parts, offset = [], 0
    for size in sizes:
        starts, stops = [0] * len(x.shape), list(x.shape)
        starts[axis], stops[axis] = offset, offset + size
        offset += size
        parts.append(
            b.op("slice", x, starts=tuple(starts), stops=tuple(stops), steps=(1,) * len(x.shape))
        )
    return tuple(parts)


declare("split", "movement", 1, attrs={"sizes": REQUIRED, "axis": 0}, decompose=_split)


def _flip_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """inputs: x
    outputs: `k = norm_axes(axes, len(x.shape)); x.shape, x.dtype`"""
    (x,) = xs
    norm_axes("flip", attrs["axes"], len(x.shape))
    return [(x.shape, x.dtype)]


declare(
    "flip",
    "movement",
    1,
    attrs={"axes": REQUIRED},
    infer=_flip_infer,
    grad=lambda b, g, xs, out, a: (b.op("flip", g, axes=a["axes"]),),
)


def _pad_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """`pads`: (before, after) per axis, non-negative; constant mode.

    inputs: x
    refused: `len(pads) != len(x.shape) or any(p0 < 0 or p1 < 0 for p0, p1 in pads)`
    outputs: `tuple(d + p0 + p1 for d, (p0, p1) in zip(x.shape, pads)), x.dtype`
    """
    (x,) = xs
    pads = attrs["pads"]
    if len(pads) != len(x.shape) or any(p0 < 0 or p1 < 0 for p0, p1 in pads):
        raise ShapeError(f"pad: need a non-negative (before, after) per axis of {fmt(x.shape)}")
    return [(tuple(d + p0 + p1 for d, (p0, p1) in zip(x.shape, pads)), x.dtype)]


def _pad_grad(
    b: Builder, g: Handle, xs: Sequence[Handle], out: Handle, attrs: Mapping[str, Any]
) -> Sequence[Handle | None]:
    pads = attrs["pads"]
    starts = tuple(p0 for p0, _ in pads)
    stops = tuple(p0 + d for (p0, _), d in zip(pads, xs[0].shape))
    return (b.op("slice", g, starts=starts, stops=stops, steps=(1,) * len(pads)),)


declare(
    "pad", "movement", 1, attrs={"pads": REQUIRED, "value": 0.0}, infer=_pad_infer, grad=_pad_grad
)


def _check_index(op: str, idx: Shaped) -> None:
    if not dtypes.is_int(idx.dtype):
        raise ShapeError(f"{op}: indices must be an integer tensor, got {idx.dtype}")


def _gather_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """torch.gather / np.take_along_axis: output has the index's shape.

    inputs: x, idx
    refused: `k = norm_axis(axis, len(x.shape)); not is_int(idx.dtype) or len(idx.shape) !=
    len(x.shape) or any(idx.shape[i] > x.shape[i] for i in range(len(x.shape)) if i != k)`
    outputs: `idx.shape, x.dtype`
    """
    x, idx = xs
    _check_index("gather", idx)
    axis = norm_axis("gather", attrs["axis"], len(x.shape))
    if len(idx.shape) != len(x.shape) or any(
        i != axis and di > dx for i, (di, dx) in enumerate(zip(idx.shape, x.shape))
    ):
        raise ShapeError(
            f"gather: index {fmt(idx.shape)} does not fit input {fmt(x.shape)} off axis {axis}"
        )
    return [(idx.shape, x.dtype)]


def _gather_grad(
    b: Builder, g: Handle, xs: Sequence[Handle], out: Handle, attrs: Mapping[str, Any]
) -> Sequence[Handle | None]:
    x, idx = xs
    zeros = b.op("full", shape=x.shape, value=0, dtype=g.dtype)
    return b.op("scatter_add", zeros, idx, g, axis=attrs["axis"]), None


declare("gather", "index", 2, attrs={"axis": REQUIRED}, infer=_gather_infer, grad=_gather_grad)


def _scatter_add_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """inputs: x, idx, src
    refused: `not is_int(idx.dtype) or idx.shape != src.shape or len(idx.shape) != len(x.shape)`
    outputs: `k = norm_axis(axis, len(x.shape)); x.shape, x.dtype`"""
    x, idx, src = xs
    _check_index("scatter_add", idx)
    norm_axis("scatter_add", attrs["axis"], len(x.shape))
    if idx.shape != src.shape or len(idx.shape) != len(x.shape):
        raise ShapeError(
            f"scatter_add: index {fmt(idx.shape)} and source {fmt(src.shape)} must match, "
            f"with the rank of {fmt(x.shape)}"
        )
    return [(x.shape, x.dtype)]


def _scatter_add_grad(
    b: Builder, g: Handle, xs: Sequence[Handle], out: Handle, attrs: Mapping[str, Any]
) -> Sequence[Handle | None]:
    return g, None, b.op("gather", g, xs[1], axis=attrs["axis"])


declare(
    "scatter_add",
    "index",
    3,
    attrs={"axis": REQUIRED},
    infer=_scatter_add_infer,
    grad=_scatter_add_grad,
)


def _index_select_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """np.take along one axis: the index may have any shape (embedding lookups).

    inputs: x, idx
    refused: `not is_int(idx.dtype)`
    outputs: `k = norm_axis(axis, len(x.shape)); x.shape[:k] + idx.shape + x.shape[k + 1 :],
    x.dtype`
    """
    x, idx = xs
    _check_index("index_select", idx)
    axis = norm_axis("index_select", attrs["axis"], len(x.shape))
    return [((*x.shape[:axis], *idx.shape, *x.shape[axis + 1 :]), x.dtype)]


def _index_select_grad(
    b: Builder, g: Handle, xs: Sequence[Handle], out: Handle, attrs: Mapping[str, Any]
) -> Sequence[Handle | None]:
    x, idx = xs
    axis = norm_axis("index_select", attrs["axis"], len(x.shape))
    return b.op("index_add", g, idx, axis=axis, size=x.shape[axis]), None


declare(
    "index_select",
    "index",
    2,
    attrs={"axis": 0},
    infer=_index_select_infer,
    grad=_index_select_grad,
)


def _index_add_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """inputs: src, idx
    refused: `not is_int(idx.dtype) or not 0 <= axis <= len(src.shape) - len(idx.shape) or
    src.shape[axis : axis + len(idx.shape)] != idx.shape`
    outputs: `src.shape[:axis] + (size,) + src.shape[axis + len(idx.shape) :], src.dtype`"""
    g, idx = xs
    _check_index("index_add", idx)
    axis = attrs["axis"]
    if not 0 <= axis <= len(g.shape) - len(idx.shape) or tuple(
        g.shape[axis : axis + len(idx.shape)]
    ) != tuple(idx.shape):
        raise ShapeError(
            f"index_add: source {fmt(g.shape)} must hold index {fmt(idx.shape)} at axis {axis}"
        )
    shape = (*g.shape[:axis], attrs["size"], *g.shape[axis + len(idx.shape) :])
    return [(shape, g.dtype)]


def _index_add_grad(
    b: Builder, g: Handle, xs: Sequence[Handle], out: Handle, attrs: Mapping[str, Any]
) -> Sequence[Handle | None]:
    return b.op("index_select", g, xs[1], axis=attrs["axis"]), None


declare(
    "index_add",
    "index",
    2,
    attrs={"axis": REQUIRED, "size": REQUIRED},
    infer=_index_add_infer,
    grad=_index_add_grad,
    doc="The adjoint of index_select: sums slices of the source into `size` rows at the indices.",
)


def _one_hot_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """inputs: idx
    refused: `not is_int(idx.dtype) or num_classes <= 0`
    outputs: `idx.shape + (num_classes,), dtype`"""
    (idx,) = xs
    _check_index("one_hot", idx)
    if attrs["num_classes"] <= 0:
        raise ShapeError(f"one_hot: num_classes must be positive, got {attrs['num_classes']}")
    return [((*idx.shape, attrs["num_classes"]), dtypes.normalize(attrs["dtype"]))]


declare(
    "one_hot",
    "index",
    1,
    attrs={"num_classes": REQUIRED, "dtype": "float32"},
    infer=_one_hot_infer,
)
