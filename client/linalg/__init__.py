"""burn_remote.linalg: linear algebra built as an extension (``linalg``, version 1).

Every function records an op of the ``linalg`` extension (wire names ``linalg.<op>@1``), so
it runs lazily on any device, replays in cached graphs, and runs on a server that has
burn-remote installed (the package announces ``linalg`` in the ``burn_remote.extensions``
entry-point group). Gradients: solve, inv, det, cholesky, qr (m >= n), svdvals, norm.

Conventions follow NumPy: batched matrices are (..., m, n); ``solve(A, b)`` treats ``b`` as
a vector right-hand side when it has one dimension fewer than ``A``.
"""

from __future__ import annotations

from typing import Any

from .._tensor import Tensor
from ._ops import cholesky, det, inv, linalg, qr, solve, svdvals, vector_norm

_ORD_NAMES = {1: "1", 2: "2", "fro": "2", None: "2", float("inf"): "inf", "inf": "inf"}


def norm(
    x: Tensor, ord: Any = None, axis: int | tuple[int, ...] | None = None, keepdims: bool = False
) -> Tensor:
    """NumPy's ``linalg.norm``: vector norms (ord 1, 2, inf) over `axis`, or over every
    element when `axis` is None and `ord` is None or 'fro'; matrix norms ('fro', 'nuc', 2)
    when `axis` is a pair, or when `x` is 2-d and `ord` is 'nuc' or 2 with no axis.

    'nuc' and the spectral norm (ord 2 on matrices) are sums and maxima of ``svdvals``, so
    their gradients come from it.
    """
    matrix_axes: tuple[int, int] | None = None
    if isinstance(axis, tuple | list) and len(axis) == 2:
        matrix_axes = (axis[0] % x.ndim, axis[1] % x.ndim)
    elif axis is None and x.ndim == 2 and ord not in (None, "fro"):
        matrix_axes = (0, 1)
    if matrix_axes is not None and ord in ("nuc", 2):
        rest = [d for d in range(x.ndim) if d not in matrix_axes]
        s = svdvals(x.permute(*rest, *matrix_axes))
        out = s.sum(axis=-1) if ord == "nuc" else s.max(axis=-1)
        if keepdims:
            for d in sorted(matrix_axes):
                out = out.unsqueeze(d)
        return out
    if matrix_axes is not None and ord not in (None, "fro"):
        raise ValueError(f"linalg.norm: matrix norm ord={ord!r} is not supported")
    if ord not in _ORD_NAMES:
        raise ValueError(f"linalg.norm: ord={ord!r} is not supported (1, 2, inf, 'fro', 'nuc')")
    axes = None if axis is None else ((axis,) if isinstance(axis, int) else tuple(axis))
    return vector_norm(x, ord=_ORD_NAMES[ord], axes=axes, keepdims=keepdims)


__all__ = ["cholesky", "det", "inv", "linalg", "norm", "qr", "solve", "svdvals", "vector_norm"]
