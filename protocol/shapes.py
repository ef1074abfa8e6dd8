"""Shape arithmetic shared by the shape rules, the kernels and the client's indexing."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .registry import ShapeError

Shape = tuple[int, ...]


def fmt(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def broadcast(op: str, *shapes: Shape) -> Shape:
    """NumPy broadcasting; the error names the op and every operand's shape."""
    if len(shapes) == 2 and shapes[0] == shapes[1]:
        return tuple(shapes[0])
    ndim = max(len(s) for s in shapes)
    out = []
    for i in range(-ndim, 0):
        dim = 1
        for s in shapes:
            d = s[i] if -i <= len(s) else 1
            if d != 1:
                if dim not in (1, d):
                    raise ShapeError(
                        f"{op}: shapes {', '.join(fmt(s) for s in shapes)} do not broadcast"
                    )
                dim = d
        out.append(dim)
    return tuple(out)


def norm_axis(op: str, axis: int, ndim: int) -> int:
    if not -ndim <= axis < max(ndim, 1):
        raise ShapeError(f"{op}: axis {axis} is out of range for a {ndim}-d tensor")
    return axis % ndim if ndim else 0


def norm_axes(op: str, axes: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    """Axes as sorted non-negative ints; None means all axes."""
    if axes is None:
        return tuple(range(ndim))
    if isinstance(axes, int):
        axes = (axes,)
    out = tuple(sorted({norm_axis(op, a, ndim) for a in axes}))
    if len(out) != len(tuple(axes)):
        raise ShapeError(f"{op}: repeated axis in {tuple(axes)}")
    return out


def reduce(shape: Shape, axes: tuple[int, ...], keepdims: bool) -> Shape:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def numel(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def conv_out(size: int, kernel: int, stride: int, pad: int, dilation: int) -> int:
    return (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1


def slice_len(start: int, stop: int, step: int) -> int:
    return len(range(start, stop, step))
