"""The ``linalg`` extension's ops: declarations, NumPy kernels and gradient rules.

Everything here goes through ``Extension`` exactly as a user's op would: no built-in op, no
engine change. Gradients that are short in terms of other ops (solve, inv, det) are written
over ops, so they are themselves differentiable; those that need a factorisation again
(cholesky, qr, svdvals) use a backward op of this extension whose kernel refactorises, the
way conv2d has conv2d_grad_input.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from burn_remote.protocol import dtypes
from burn_remote.protocol.registry import NOT_DIFFERENTIABLE, ShapeError
from burn_remote.protocol.shapes import fmt, norm_axes
from burn_remote.protocol.shapes import reduce as reduce_shape

from .._extension import Extension

linalg = Extension("linalg", version="1", doc="Linear algebra: solve, inv, det, factorisations.")

Spec = tuple[tuple[int, ...], str]


def _float(op: str, *xs: Any) -> str:
    dtype = xs[0].dtype
    for x in xs[1:]:
        dtype = dtypes.promote(dtype, x.dtype)
    if dtype not in ("float32", "float64"):
        raise ShapeError(f"linalg.{op}: expected float32 or float64 operands, got {dtype}")
    return dtype


def _square(op: str, a: Any) -> tuple[int, ...]:
    if len(a.shape) < 2 or a.shape[-1] != a.shape[-2]:
        raise ShapeError(f"linalg.{op}: expected square matrices (..., n, n), got {fmt(a.shape)}")
    return a.shape


def _mT(x: Any) -> Any:
    return x.transpose(-1, -2)


# --- solve --------------------------------------------------------------------------------


def _solve_infer(xs: Any, attrs: Any) -> list[Spec]:
    a, b = xs
    shape = _square("solve", a)
    vector = len(b.shape) == len(shape) - 1
    if (vector and b.shape != shape[:-1]) or (
        not vector and (len(b.shape) != len(shape) or b.shape[:-1] != shape[:-1])
    ):
        raise ShapeError(
            f"linalg.solve: right-hand side {fmt(b.shape)} does not fit matrices {fmt(shape)} "
            "(expected (..., n) or (..., n, k) with the same batch)"
        )
    return [(b.shape, _float("solve", a, b))]


def _solve_kernel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if b.ndim == a.ndim - 1:
        return np.linalg.solve(a, b[..., None])[..., 0]
    return np.linalg.solve(a, b)


def _solve_grad(bld: Any, g: Any, xs: Any, out: Any, attrs: Any) -> tuple[Any, Any]:
    a, _ = xs
    gb = solve(_mT(a), g)
    if out.ndim == a.ndim - 1:
        ga = -(gb.unsqueeze(-1) * out.unsqueeze(-2))
    else:
        ga = -(gb @ _mT(out))
    return ga, gb


solve = linalg.op(
    "solve",
    arity=2,
    infer=_solve_infer,
    grad=_solve_grad,
    kernels={"cpu": _solve_kernel},
    doc="X with A X = B; B is (..., n) (vector right-hand side) or (..., n, k).",
)

# --- inv, det -----------------------------------------------------------------------------


def _inv_grad(bld: Any, g: Any, xs: Any, out: Any, attrs: Any) -> tuple[Any]:
    yt = _mT(out)
    return (-(yt @ g @ yt),)


inv = linalg.op(
    "inv",
    arity=1,
    infer=lambda xs, a: [(_square("inv", xs[0]), _float("inv", xs[0]))],
    grad=_inv_grad,
    kernels={"cpu": lambda a: np.linalg.inv(a)},
    doc="Matrix inverse of (..., n, n).",
)


def _det_grad(bld: Any, g: Any, xs: Any, out: Any, attrs: Any) -> tuple[Any]:
    (a,) = xs
    scale = (g * out).unsqueeze(-1).unsqueeze(-1)
    return (scale * _mT(inv(a)),)


det = linalg.op(
    "det",
    arity=1,
    infer=lambda xs, a: [(_square("det", xs[0])[:-2], _float("det", xs[0]))],
    grad=_det_grad,
    kernels={"cpu": lambda a: np.asarray(np.linalg.det(a))},
    doc="Determinant of (..., n, n); the gradient is det(A) inv(A)^T (A must be invertible).",
)

# --- cholesky -----------------------------------------------------------------------------


def _phi_sym(x: np.ndarray) -> np.ndarray:
    """0.5 * (tril(x) + tril(x, -1)^T): the symmetric matrix of x's lower triangle, halved."""
    low = np.tril(x)
    return 0.5 * (low + np.swapaxes(np.tril(x, -1), -1, -2))


def _cholesky_backward_kernel(l: np.ndarray, gl: np.ndarray) -> np.ndarray:
    # gA = L^-T Phi(L^T gL) L^-1, symmetrised (Murray 2016; as PyTorch's cholesky_backward).
    p = _phi_sym(np.tril(np.swapaxes(l, -1, -2) @ np.tril(gl)))
    linv = np.linalg.inv(l)
    return np.swapaxes(linv, -1, -2) @ p @ linv


_cholesky_backward = linalg.op(
    "cholesky_backward",
    arity=2,
    infer=lambda xs, a: [(xs[0].shape, _float("cholesky_backward", *xs))],
    grad=NOT_DIFFERENTIABLE,
    kernels={"cpu": _cholesky_backward_kernel},
    doc="Gradient of cholesky: inputs (L, dL/dout); the result is symmetric.",
)

cholesky = linalg.op(
    "cholesky",
    arity=1,
    infer=lambda xs, a: [(_square("cholesky", xs[0]), _float("cholesky", xs[0]))],
    grad=lambda bld, g, xs, out, a: (_cholesky_backward(out, g),),
    kernels={"cpu": lambda a: np.linalg.cholesky(a)},
    doc=(
        "Lower L with A = L L^T for symmetric positive-definite A. Reads the lower triangle; "
        "the gradient is the symmetric one (as PyTorch and JAX): exact for symmetric changes."
    ),
)

# --- qr -----------------------------------------------------------------------------------


def _qr_infer(xs: Any, attrs: Any) -> list[Spec]:
    (a,) = xs
    if len(a.shape) < 2:
        raise ShapeError(f"linalg.qr: expected matrices (..., m, n), got {fmt(a.shape)}")
    *batch, m, n = a.shape
    k = min(m, n)
    dtype = _float("qr", a)
    return [((*batch, m, k), dtype), ((*batch, k, n), dtype)]


def _qr_backward_kernel(a: np.ndarray, gq: np.ndarray, gr: np.ndarray) -> np.ndarray:
    # Reduced QR with m >= n: M = R gR^T - gQ^T Q; gA = (gQ + Q copyltu(M)) R^-T.
    q, r = np.linalg.qr(a)
    m = r @ np.swapaxes(gr, -1, -2) - np.swapaxes(gq, -1, -2) @ q
    low = np.tril(m, -1)
    sym = low + np.swapaxes(low, -1, -2) + np.tril(np.triu(m))
    rhs = gq + q @ sym
    return np.swapaxes(np.linalg.solve(r, np.swapaxes(rhs, -1, -2)), -1, -2)


def _qr_backward_infer(xs: Any, attrs: Any) -> list[Spec]:
    a = xs[0]
    if a.shape[-2] < a.shape[-1]:
        raise ShapeError(f"linalg.qr: the gradient needs m >= n, got {fmt(a.shape)}")
    return [(a.shape, _float("qr_backward", *xs))]


_qr_backward = linalg.op(
    "qr_backward",
    arity=3,
    infer=_qr_backward_infer,
    grad=NOT_DIFFERENTIABLE,
    kernels={"cpu": _qr_backward_kernel},
    doc="Gradient of qr: inputs (A, dL/dQ, dL/dR); needs m >= n.",
)


def _qr_grad(bld: Any, g: Any, xs: Any, out: Any, attrs: Any) -> tuple[Any]:
    (a,) = xs
    *batch, m, n = a.shape
    k = min(m, n)
    gq, gr = g
    if gq is None:
        gq = bld.op("full", shape=(*batch, m, k), value=0.0, dtype=a.dtype)
    if gr is None:
        gr = bld.op("full", shape=(*batch, k, n), value=0.0, dtype=a.dtype)
    return (_qr_backward(a, gq, gr),)


qr = linalg.op(
    "qr",
    arity=1,
    infer=_qr_infer,
    grad=_qr_grad,
    n_outputs=2,
    kernels={"cpu": lambda a: tuple(np.linalg.qr(a))},
    doc="Reduced QR: Q (..., m, k), R (..., k, n), k = min(m, n). Gradient for m >= n.",
)

# --- svdvals ------------------------------------------------------------------------------


def _svdvals_infer(xs: Any, attrs: Any) -> list[Spec]:
    (a,) = xs
    if len(a.shape) < 2:
        raise ShapeError(f"linalg.svdvals: expected matrices (..., m, n), got {fmt(a.shape)}")
    return [((*a.shape[:-2], min(a.shape[-2:])), _float("svdvals", a))]


def _svdvals_backward_kernel(a: np.ndarray, gs: np.ndarray) -> np.ndarray:
    u, _, vt = np.linalg.svd(a, full_matrices=False)
    return (u * gs[..., None, :]) @ vt


_svdvals_backward = linalg.op(
    "svdvals_backward",
    arity=2,
    infer=lambda xs, a: [(xs[0].shape, _float("svdvals_backward", *xs))],
    grad=NOT_DIFFERENTIABLE,
    kernels={"cpu": _svdvals_backward_kernel},
    doc="Gradient of svdvals: U diag(g) V^T (defined where singular values are distinct).",
)

svdvals = linalg.op(
    "svdvals",
    arity=1,
    infer=_svdvals_infer,
    grad=lambda bld, g, xs, out, a: (_svdvals_backward(xs[0], g),),
    kernels={"cpu": lambda a: np.linalg.svd(a, compute_uv=False)},
    doc="Singular values of (..., m, n), descending, shape (..., min(m, n)).",
)

# --- vector norms -------------------------------------------------------------------------

_ORDS = ("1", "2", "inf")


def _norm_infer(xs: Any, attrs: Any) -> list[Spec]:
    (x,) = xs
    if attrs["ord"] not in _ORDS:
        raise ShapeError(f"linalg.vector_norm: ord {attrs['ord']!r} is not one of {_ORDS}")
    axes = norm_axes("linalg.vector_norm", attrs["axes"], len(x.shape))
    return [(reduce_shape(x.shape, axes, attrs["keepdims"]), _float("vector_norm", x))]


def _norm_kernel(x: np.ndarray, ord: str, axes: Any, keepdims: bool) -> np.ndarray:
    ax = tuple(axes) if axes is not None else None
    if ord == "2":
        return np.sqrt(np.sum(x * x, axis=ax, keepdims=keepdims))
    if ord == "1":
        return np.sum(np.abs(x), axis=ax, keepdims=keepdims)
    return np.max(np.abs(x), axis=ax, keepdims=keepdims)


def _norm_grad(bld: Any, g: Any, xs: Any, out: Any, attrs: Any) -> tuple[Any]:
    (x,) = xs
    axes = norm_axes("linalg.vector_norm", attrs["axes"], x.ndim)
    kept = reduce_shape(x.shape, axes, True)
    g, out = g.reshape(kept), out.reshape(kept)
    if attrs["ord"] == "2":
        return (g * x / out,)
    if attrs["ord"] == "1":
        return (g * bld.op("sign", x),)
    # inf: the (sub)gradient goes to the entries that reach the maximum
    return (g * bld.op("sign", x) * (x.abs() == out).cast(x.dtype),)


vector_norm = linalg.op(
    "vector_norm",
    arity=1,
    attrs={"ord": "2", "axes": None, "keepdims": False},
    infer=_norm_infer,
    grad=_norm_grad,
    kernels={"cpu": _norm_kernel},
    doc="Vector norm over `axes` (None: all): ord '1' (sum |x|), '2', 'inf' (max |x|).",
)
