"""NumPy kernels, one per primitive op, registered by the op's registry name.

A kernel takes NumPy arrays and the op's bound attributes and returns an array (a tuple for
multi-output ops) of exactly the dtype and shape the op's shape rule declared; the executor
relies on that and never converts after the fact.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...protocol import dtypes
from ...protocol.ops_nn import NF4_CODEBOOK
from ..collective import all_reduce_kernel
from .array_module import Array
from .array_module import array_module as _mod
from .cpu_threads import PARALLEL_MIN_WORK, TRANSCENDENTAL_PASSES, run_parallel, shares, threads
from .numpy_conv_kernels import CONV_KERNELS
from .numpy_helpers import add_at, open_grid
from .numpy_optim_kernels import OPTIM_KERNELS

Kernel = Callable[..., Any]
"""A kernel: arrays and bound attributes in, an array (a tuple for several outputs) out."""
KERNELS: dict[str, Kernel] = {}
Axes = int | tuple[int, ...] | None
"""A reduction's ``axes`` attribute: one axis, several, or None for all."""


def kernel(name: str) -> Callable[[Kernel], Kernel]:
    """Register the decorated function as the NumPy kernel of op ``name`` (once)."""

    def register(fn: Kernel) -> Kernel:
        if name in KERNELS:
            raise ValueError(f"numpy kernel {name!r} registered twice")
        KERNELS[name] = fn
        return fn

    return register


# Registered beside these kernels, from modules of their own (same table, one name each).
for _name, _fn in (
    *OPTIM_KERNELS.items(),
    *CONV_KERNELS.items(),
    ("all_reduce", all_reduce_kernel),
):
    kernel(_name)(_fn)


def _ufunc(name: str, fn: Callable[..., Any]) -> None:
    KERNELS[name] = lambda x: fn(x)


_UNARY: dict[str, Callable[..., Any]] = {
    "neg": np.negative,
    "abs": np.abs,
    "sign": np.sign,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "sin": np.sin,
    "cos": np.cos,
    "tanh": np.tanh,
    "floor": np.floor,
    "logical_not": np.logical_not,
}
for _name, _fn in _UNARY.items():
    _ufunc(_name, _fn)

_BINARY: dict[str, np.ufunc] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
}


def _threaded_binary(fn: np.ufunc) -> Callable[..., Any]:
    """``fn(a, b[, out])``, split along the result's first axis over the engine's threads when
    it is large (cpu_threads.PARALLEL_MIN_WORK): each element is computed exactly as one
    call would (NumPy releases the GIL in its loops); small or mixed-dtype calls go straight
    to the ufunc, and so do CuPy arrays."""

    def run(a: Any, b: Any, out: Any = None) -> Any:
        if (
            type(a) is np.ndarray
            and type(b) is np.ndarray
            and a.dtype == b.dtype
            and max(a.size, b.size) >= PARALLEL_MIN_WORK
            and threads() > 1
        ):
            return _split_binary(fn, a, b, out)
        return fn(a, b) if out is None else fn(a, b, out=out)

    run.__name__ = fn.__name__
    run.__wrapped__ = fn  # type: ignore[attr-defined]  # the plain ufunc (numpy_blocks)
    return run


def _split_binary(fn: np.ufunc, a: np.ndarray, b: np.ndarray, out: Any) -> Any:
    shape = np.broadcast_shapes(a.shape, b.shape)
    if not shape or shape[0] < 2:
        return fn(a, b) if out is None else fn(a, b, out=out)
    target = (
        np.empty(shape, fn.resolve_dtypes((a.dtype, b.dtype, None))[2]) if out is None else out[0]
    )
    rows = shape[0]
    spans = shares(rows, threads())

    def rows_of(x: np.ndarray, i: int, j: int) -> np.ndarray:
        # an operand along the result's first axis is cut; a broadcast one is passed whole
        return x[i:j] if x.ndim == len(shape) and x.shape[0] == rows else x

    def part(span: tuple[int, int]) -> None:
        i, j = span
        fn(rows_of(a, i, j), rows_of(b, i, j), out=target[i:j])

    run_parallel(part, spans, target.size)
    return target


for _name, _fn in _BINARY.items():
    KERNELS[_name] = _threaded_binary(_fn) if _name in ("add", "sub", "mul") else _fn


def _threaded_rows(fn: Kernel) -> Kernel:
    """``fn(x, **attrs)`` for a float kernel whose every element of the result depends only
    on its own row (along the first axis): a large input is cut into rows over the engine's
    threads, each part computed by ``fn`` itself, so each element gets the bits one call
    would give. For the transcendental ops (exp, tanh, sigmoid, ...), which NumPy runs at a
    few ns an element; an ``axis`` attribute of 0 (a reduction across rows) runs whole."""

    def run(x: Any, **attrs: Any) -> Any:
        if (
            type(x) is not np.ndarray
            or x.dtype.kind != "f"
            or x.ndim == 0
            or x.shape[0] < 2
            or x.size * TRANSCENDENTAL_PASSES < PARALLEL_MIN_WORK
            or threads() < 2
            or attrs.get("axis", -1) % x.ndim == 0
        ):
            return fn(x, **attrs)
        out = np.empty(x.shape, x.dtype)

        def part(span: tuple[int, int]) -> None:
            out[span[0] : span[1]] = fn(x[span[0] : span[1]], **attrs)

        run_parallel(part, shares(x.shape[0], threads()), x.size * TRANSCENDENTAL_PASSES)
        return out

    run.__name__ = getattr(fn, "__name__", "kernel")
    run.__wrapped__ = fn  # type: ignore[attr-defined]  # the kernel on one thread (numpy_blocks)
    return run


THREADED_ROWS = ("exp", "log", "sin", "cos", "tanh", "sigmoid", "softplus", "erf", "softmax",
                 "log_softmax")  # fmt: skip
"""Kernels split by rows over the engine's threads when large (``_threaded_rows``): all are
float in, same float out, row by row."""


WRITES_INTO: dict[str, tuple[int, ...]] = {
    **{name: (0, 1) for name in ("add", "sub", "mul", "maximum", "minimum")},  # ufuncs: out=
    "adam_update": (0, 2, 3),  # p, m, v
}
"""The CPU backend's ``Backend.writes_into``: op -> inputs its kernel may write into (out=)."""


def _like(x: np.ndarray, value: Any) -> np.ndarray:
    return np.asarray(value, dtype=x.dtype)


@kernel("div")
def _div(a: Array, b: Array) -> Array:
    if np.issubdtype(np.result_type(a, b), np.integer):
        out_dtype = np.result_type(a, b)
        with np.errstate(divide="ignore"):
            return np.floor_divide(a, b).astype(out_dtype, copy=False)
    return np.divide(a, b)


@kernel("pow")
def _pow(a: Array, b: Array) -> Array:
    return np.power(a, b)


@kernel("rsqrt")
def _rsqrt(x: Array) -> Array:
    return np.reciprocal(np.sqrt(x))


@kernel("sigmoid")
def _sigmoid(x: Array) -> Array:
    # exp of -|x| never overflows; pick the stable branch per element: 1 / (1 + e) or
    # e / (1 + e). On NumPy floats the numerator is max(e, x >= 0), the same value as the
    # branch (0 <= e <= 1, NaN kept) without np.where, which mispredicts on a random mask
    # (measured 4.0 ms against 0.4 over 512 x 1536 float32); the other passes in place
    if type(x) is np.ndarray and x.ndim and x.dtype in _INPLACE_FLOATS:
        e = np.abs(x)
        np.negative(e, out=e)
        np.exp(e, out=e)
        r = np.maximum(e, x >= 0)
        return np.divide(r, np.add(e, 1, out=e), out=r)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


_INPLACE_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


@kernel("relu")
def _relu(x: Array) -> Array:
    return np.maximum(x, _like(x, 0))


@kernel("softplus")
def _softplus(x: Array) -> Array:
    return (np.maximum(x, _like(x, 0)) + np.log1p(np.exp(-np.abs(x)))).astype(x.dtype, copy=False)


_erf = np.frompyfunc(math.erf, 1, 1)


@kernel("erf")
def _erf_kernel(x: Array) -> Array:
    try:
        from scipy.special import erf  # a vectorised erf when SciPy is present

        return erf(x).astype(x.dtype, copy=False)
    except ImportError:  # (the Python erf per element gives a bare float for a 0-d input)
        return np.asarray(_erf(x), dtype=x.dtype)


@kernel("where")
def _where(c: Array, a: Array, b: Array) -> Array:
    if (
        b.ndim == 0
        and a.shape == c.shape
        and a.dtype == b.dtype
        and a.dtype.kind == "f"
        and type(a) is np.ndarray
        and not b
    ):
        # where(c, a, 0), a ReLU's gradient every step: a multiply is 3x faster than where.
        # It differs only where a is not finite (nan * 0), so that case takes the exact path.
        out = np.multiply(a, c)
        if np.isfinite(out).all():
            return out
    return np.where(c, a, b)


@kernel("cast")
def _cast(x: Array, dtype: str) -> Array:
    return x.astype(dtypes.to_numpy(dtype))


@kernel("full")
def _full(shape: Sequence[int], value: float, dtype: str) -> Array:
    if value == 0 and math.copysign(1.0, float(value)) > 0:
        # zeros from calloc: pages untouched until written (an optimizer's moments); not -0.0
        return np.zeros(shape, dtype=dtypes.to_numpy(dtype))
    return np.full(shape, value, dtype=dtypes.to_numpy(dtype))


# --- reductions -----------------------------------------------------------------------------


def _axes(axes: Axes) -> tuple[int, ...] | None:
    return None if axes is None else (axes if isinstance(axes, tuple) else (axes,))


_SUMMED_AS_IS = (np.dtype(np.float32), np.dtype(np.float64))
"""Dtypes ``ndarray.sum`` adds in as they are (the same loop as ``dtype=`` the input's)."""


@kernel("sum")
def _sum(x: Array, axes: Axes, keepdims: bool) -> Array:
    if type(x) is np.ndarray and x.dtype in _SUMMED_AS_IS:  # np.sum's wrapper costs 3 us
        r = x.sum(axis=_axes(axes), keepdims=keepdims)
        return r if type(r) is np.ndarray else np.asarray(r)
    dt = np.int64 if x.dtype.kind in "biu" else x.dtype
    return _mod(x).asarray(np.sum(x, axis=_axes(axes), keepdims=keepdims, dtype=dt))


@kernel("max")
def _max(x: Array, axes: Axes, keepdims: bool) -> Array:
    return _mod(x).asarray(np.max(x, axis=_axes(axes), keepdims=keepdims))


@kernel("min")
def _min(x: Array, axes: Axes, keepdims: bool) -> Array:
    return _mod(x).asarray(np.min(x, axis=_axes(axes), keepdims=keepdims))


def _arg(fn: Callable[..., Array]) -> Kernel:
    def run(x: Array, axis: int | None, keepdims: bool) -> Array:
        if axis is None:
            r = _mod(x).asarray(fn(x), dtype=np.int64)
            return r.reshape((1,) * x.ndim) if keepdims else r
        return _mod(x).asarray(fn(x, axis=axis, keepdims=keepdims), dtype=np.int64)

    return run


KERNELS["argmax"] = _arg(np.argmax)
KERNELS["argmin"] = _arg(np.argmin)


@kernel("logsumexp")
def _logsumexp(x: Array, axes: Axes, keepdims: bool) -> Array:
    axes = _axes(axes)
    m = np.max(x, axis=axes, keepdims=True) if x.size else _mod(x).zeros((1,) * x.ndim, x.dtype)
    m = np.where(np.isfinite(m), m, 0)
    with np.errstate(divide="ignore"):  # an empty axis sums to 0: log gives -inf
        out = np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m
    return _mod(x).asarray(out if keepdims else np.squeeze(out, axis=axes), dtype=x.dtype)


def _shift(x: Array, axis: int) -> Array:
    """x minus its max along axis (finite maxima only), for overflow-free exponentials."""
    if x.size == 0:
        return x.copy()
    m = np.max(x, axis=axis, keepdims=True)
    return x - np.where(np.isfinite(m), m, 0).astype(x.dtype, copy=False)


@kernel("softmax")
def _softmax(x: Array, axis: int) -> Array:
    e = np.exp(_shift(x, axis))
    e /= np.sum(e, axis=axis, keepdims=True)
    return e


@kernel("log_softmax")
def _log_softmax(x: Array, axis: int) -> Array:
    s = _shift(x, axis)
    with np.errstate(divide="ignore"):
        return s - np.log(np.sum(np.exp(s), axis=axis, keepdims=True))


@kernel("matmul")
def _matmul(a: Array, b: Array) -> Array:
    if type(a) is not np.ndarray or type(b) is not np.ndarray:  # CuPy: as written
        return np.matmul(a, b)
    if b.ndim == 2 and a.ndim > 2 and a.flags.c_contiguous:
        # a batch of rows times one matrix (a linear layer): one GEMM over all the rows, not
        # one per batch entry (NumPy loops over the batch)
        return np.matmul(a.reshape(-1, a.shape[-1]), b).reshape(*a.shape[:-1], b.shape[-1])
    return np.matmul(a, b)


# --- movement ---------------------------------------------------------------------------


@kernel("reshape")
def _reshape(x: Array, shape: Sequence[int]) -> Array:
    return x.reshape(shape)


@kernel("permute")
def _permute(x: Array, dims: Sequence[int]) -> Array:
    return x.transpose(dims)


@kernel("expand")
def _expand(x: Array, shape: Sequence[int]) -> Array:
    return np.broadcast_to(x, shape)


def _slices(starts: Sequence[int], stops: Sequence[int], steps: Sequence[int]) -> tuple[slice, ...]:
    return tuple(slice(a, None if o < 0 else o, s) for a, o, s in zip(starts, stops, steps))


@kernel("slice")
def _slice(x: Array, starts: Sequence[int], stops: Sequence[int], steps: Sequence[int]) -> Array:
    return x[_slices(starts, stops, steps)]


@kernel("slice_backward")
def _slice_backward(
    g: Array,
    in_shape: Sequence[int],
    starts: Sequence[int],
    stops: Sequence[int],
    steps: Sequence[int],
) -> Array:
    out = _mod(g).zeros(in_shape, dtype=g.dtype)
    out[_slices(starts, stops, steps)] = g
    return out


@kernel("cat")
def _cat(*xs: Array, axis: int) -> Array:
    dt = np.result_type(*xs)
    return np.concatenate(xs, axis=axis).astype(dt, copy=False)


@kernel("flip")
def _flip(x: Array, axes: Axes) -> Array:
    return np.flip(x, axis=axes)


@kernel("pad")
def _pad(x: Array, pads: Sequence[tuple[int, int]], value: float) -> Array:
    if x.ndim == 0:  # nothing to pad; np.pad refuses an empty pad list
        return x.copy()
    return np.pad(x, pads, mode="constant", constant_values=value)


@kernel("gather")
def _gather(x: Array, idx: Array, axis: int) -> Array:
    return np.take_along_axis(x, idx, axis=axis)


@kernel("scatter_add")
def _scatter_add(x: Array, idx: Array, src: Array, axis: int) -> Array:
    out = x.copy()
    grids = open_grid(_mod(x), idx.shape)
    grids[axis % x.ndim] = idx
    add_at(out, tuple(grids), src)
    return out


@kernel("index_select")
def _index_select(x: Array, idx: Array, axis: int) -> Array:
    return np.take(x, idx, axis=axis)


@kernel("index_add")
def _index_add(g: Array, idx: Array, axis: int, size: int) -> Array:
    shape = (*g.shape[:axis], size, *g.shape[axis + idx.ndim :])
    out = _mod(g).zeros(shape, dtype=g.dtype)
    flat_g = g.reshape((*g.shape[:axis], idx.size, *g.shape[axis + idx.ndim :]))
    add_at(out, (slice(None),) * axis + (idx.reshape(-1),), flat_g)
    return out


@kernel("one_hot")
def _one_hot(idx: Array, num_classes: int, dtype: str) -> Array:
    return (idx[..., None] == _mod(idx).arange(num_classes)).astype(dtypes.to_numpy(dtype))


# --- randomness -------------------------------------------------------------------------


def mix32(x: Array) -> Array:
    """The 32-bit finaliser of the documented draw, on either array module (uint32 wraps)."""
    x = x.astype(np.uint32)
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return x


def uniform_bits(key: Any, n: int, stream: int, xp: Any = np) -> Any:
    """The counter-based draw documented in protocol.ops_nn.RANDOM_DOC, as uniform float64.

    `key` is a Python int or a 0-d integer array of module `xp`; on CuPy every step runs on
    the device, so a draw never waits for the key to come back to the host.
    """
    k = xp.asarray(key if xp is not np else int(key) & 0xFFFFFFFFFFFFFFFF)
    k = k.astype(np.int64).astype(np.uint64) if k.dtype.kind != "u" else k.astype(np.uint64)
    lo = (k & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    hi = (k >> np.uint64(32)).astype(np.uint32)
    with np.errstate(over="ignore"):
        salt = mix32(hi.reshape(1) + np.uint32((0x9E3779B9 * (stream + 1)) & 0xFFFFFFFF))
        seed = mix32(lo.reshape(1) ^ salt)
        h = mix32(xp.arange(n, dtype=np.uint32) ^ seed)
    return (h >> np.uint32(8)).astype(np.float64) * 2.0**-24


@kernel("uniform")
def _uniform(
    key: Array, shape: Sequence[int], low: float, high: float, dtype: str, stream: int
) -> Array:
    n = int(np.prod(shape, dtype=np.int64))
    u = uniform_bits(key, n, stream, _mod(key)).reshape(shape)
    return (u * (high - low) + low).astype(dtypes.to_numpy(dtype))


# --- quantisation -------------------------------------------------------------------------

_NF4 = np.asarray(NF4_CODEBOOK, dtype=np.float32)
_NF4_MID = (_NF4[1:] + _NF4[:-1]) / 2


def _blocks(x: Array, block: int) -> tuple[Array, Array, Array]:
    xb = x.astype(np.float32).reshape(-1, block)
    absmax = np.abs(xb).max(axis=1)
    return xb, absmax, np.where(absmax > 0, absmax, 1).astype(np.float32)


@kernel("quantize_int8")
def _quantize_int8(x: Array, block: int) -> tuple[Array, Array]:
    xb, absmax, safe = _blocks(x, block)
    q = np.clip(np.rint(xb / safe[:, None] * 127), -127, 127).astype(np.int8)
    return q.reshape(-1), absmax.astype(np.float32)


@kernel("dequantize_int8")
def _dequantize_int8(
    q: Array, scales: Array, block: int, shape: Sequence[int], dtype: str
) -> Array:
    x = q.astype(np.float32).reshape(-1, block) * (scales[:, None] / 127)
    return x.reshape(shape).astype(dtypes.to_numpy(dtype))


@kernel("quantize_nf4")
def _quantize_nf4(x: Array, block: int) -> tuple[Array, Array]:
    xb, absmax, safe = _blocks(x, block)
    m = _mod(x)
    codes = m.searchsorted(m.asarray(_NF4_MID), (xb / safe[:, None]).reshape(-1)).astype(np.uint8)
    return (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8), absmax.astype(np.float32)


@kernel("dequantize_nf4")
def _dequantize_nf4(
    packed: Array, scales: Array, block: int, shape: Sequence[int], dtype: str
) -> Array:
    m = _mod(packed)
    codes = m.empty(packed.size * 2, dtype=np.uint8)
    codes[0::2] = packed & 0x0F
    codes[1::2] = packed >> 4
    x = m.asarray(_NF4)[codes].reshape(-1, block) * scales[:, None]
    return x.reshape(shape).astype(dtypes.to_numpy(dtype))


# --- fused optimizer updates ------------------------------------------------------------


def _ce_parts(logits: Array, target: Array, ignore_index: int) -> tuple[Array, Array, Array, Array]:
    """log-softmax over the last axis, the counted rows, their targets made safe to index,
    and the count of counted rows (at least 1): a Python int on NumPy, a 0-d array on a GPU
    module, so nothing waits for the device."""
    xp = _mod(logits)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    logp = shifted - xp.log(xp.exp(shifted).sum(axis=-1, keepdims=True))
    target = target.astype(xp.int64, copy=False)
    valid = target != ignore_index
    safe = xp.where(valid, target, 0)
    count = max(int(valid.sum()), 1) if xp is np else xp.maximum(valid.sum(), 1)
    return logp, valid, safe, count


def all_counted(xp: Any, target: Any, ignore_index: Any) -> bool:
    """Whether no row is ignored. Asked on NumPy only: on a GPU the answer costs a sync, so
    the device path is the general one, with no branch on data."""
    return xp is np and bool((target != ignore_index).all())


@kernel("cross_entropy")
def _cross_entropy(
    logits: Array, target: Array, ignore_index: int, label_smoothing: float
) -> Array:
    xp = _mod(logits)
    if logits.ndim == 2 and not label_smoothing and all_counted(xp, target, ignore_index):
        # the common case (a batch of rows, nothing ignored): log-sum-exp minus the pick
        z = logits - logits.max(axis=-1, keepdims=True)
        lse = xp.log(xp.exp(z).sum(axis=-1))
        lse -= z[xp.arange(z.shape[0]), target]
        return xp.asarray(lse.mean(), dtype=logits.dtype)
    logp, valid, safe, count = _ce_parts(logits, target, ignore_index)
    nll = -xp.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]
    if label_smoothing:
        nll = nll * (1 - label_smoothing) - logp.mean(axis=-1) * label_smoothing
    return xp.asarray((nll * valid).sum() / count, dtype=logits.dtype)


@kernel("cross_entropy_backward")
def _cross_entropy_backward(
    g: Array, logits: Array, target: Array, ignore_index: int, label_smoothing: float
) -> Array:
    xp = _mod(logits)
    grad = xp.exp(logits - logits.max(axis=-1, keepdims=True))
    grad /= grad.sum(axis=-1, keepdims=True)
    if logits.ndim == 2 and not label_smoothing and all_counted(xp, target, ignore_index):
        grad[xp.arange(grad.shape[0]), target] -= 1  # the common case: softmax - onehot
        grad *= float(g) / grad.shape[0]
        return grad
    target = target.astype(xp.int64, copy=False)
    valid = target != ignore_index
    if label_smoothing:
        grad -= label_smoothing / logits.shape[-1]
    flat = grad.reshape(-1, logits.shape[-1])
    if xp is np:
        count = int(valid.sum())
        safe = target if count == valid.size else xp.where(valid, target, 0)
        flat[xp.arange(flat.shape[0]), safe.reshape(-1)] -= 1 - label_smoothing
        if count == valid.size:  # nothing ignored: one scale for every row
            grad *= float(g) / max(count, 1)
        else:
            grad *= (valid * (float(g) / max(count, 1)))[..., None].astype(grad.dtype, copy=False)
        return grad
    # on the device: the same arithmetic with the count and the scale left as 0-d arrays
    safe = xp.where(valid, target, 0)
    flat[xp.arange(flat.shape[0]), safe.reshape(-1)] -= 1 - label_smoothing
    scale = g.astype(grad.dtype) / xp.maximum(valid.sum(), 1).astype(grad.dtype)
    grad *= (valid.astype(grad.dtype) * scale)[..., None]
    return grad


for _name in THREADED_ROWS:
    KERNELS[_name] = _threaded_rows(KERNELS[_name])
