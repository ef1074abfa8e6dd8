"""The optimizers' fused update kernels (``adam_update``, ``sgd_update``), which
``numpy_kernels`` registers into its ``KERNELS`` (NumPy and, through ``array_module``, CuPy
arrays): one call per parameter per step, so each is written for the fewest passes over
memory."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from .array_module import Array
from .array_module import array_module as _mod
from .cpu_threads import run_parallel, shares, threads

ADAM_CHUNK = 1 << 17
"""Elements per chunk of the CPU Adam update: the chunk's slices of the four arrays and its
scratch (5 x 512 KiB in float32) stay in the last-level cache while the update makes its
dozen passes, so main memory sees each array about once per step. Smaller chunks fit L2 but
pay the dozen NumPy calls (and, on two threads, the GIL hand-offs between them) more often:
on a 2-core EPYC (1 MiB L2), GPT-2's 38.6M-element embedding took 126 ms at 2**15, 95 at
2**16, 90 at 2**17 and 85 at 2**18 on two threads, against 26 ms for one plain copy of it
(a 2**17 chunk cut the whole AdamW step of GPT-2-small from ~530 to ~350 ms)."""

ADAM_PASSES = 11
"""Element passes of one chunk's update (``_adam_span``): the work ``run_parallel`` weighs."""

SPAN_ALIGN = 64
"""Each thread's share of a chunked update starts on a multiple of this many elements (whole
64-byte cache lines in float32 and float64), so no two threads write into one line."""

_CHUNKED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _adam_update(
    p: Array, g: Array, m: Array, v: Array, lr: Array, bc1: Array, bc2: Array,
    beta1: float, beta2: float, eps: float, weight_decay: float, decoupled: bool,
    out: tuple[Array, Array, Array] | None = None,
) -> tuple[Array, ...]:  # fmt: skip
    """One parameter's AdamW/Adam step: (new p, new m, new v).

    On the CPU the update runs chunk by chunk over the engine's threads, every pass in the
    order written below, so the bits equal the unchunked form. ``out``: (p, m, v) arrays to
    write the results into (the executor passes the donated inputs themselves: no new array
    per step); they may be ``p``, ``m`` and ``v``.
    """
    if p.ndim == 0:  # a scalar parameter: NumPy's 0-d arithmetic gives scalars, not buffers
        one = _adam_update(
            p.reshape(1), g.reshape(1), m.reshape(1), v.reshape(1),
            lr, bc1, bc2, beta1, beta2, eps, weight_decay, decoupled,
        )  # fmt: skip
        return tuple(a.reshape(()) for a in one)
    xp = _mod(p)
    if xp is np and _chunkable(p, g, m, v):
        lr, bc1, bc2 = float(lr), float(bc1), float(bc2)
        if p.size <= ADAM_CHUNK:  # small: per-call cost rules, fewest NumPy calls win
            if out is not None and out[0] is p and out[1] is m and out[2] is v:
                _adam_small_in_place(p, g, m, v, lr, bc1, bc2, beta1, beta2, eps,
                                     weight_decay, decoupled)  # fmt: skip
                return out
            return _adam_whole(
                p, g, m, v, lr, bc1, bc2, beta1, beta2, eps, weight_decay, decoupled, np
            )
        if out is None:
            out = (np.empty_like(p), np.empty_like(m), np.empty_like(v))
        _adam_chunked(
            p, np.ascontiguousarray(g), m, v, out, lr, bc1, bc2, beta1, beta2, eps,
            weight_decay, decoupled,
        )  # fmt: skip
        return out
    return _adam_whole(p, g, m, v, lr, bc1, bc2, beta1, beta2, eps, weight_decay, decoupled, xp)


def _chunkable(p: Any, g: Any, m: Any, v: Any) -> bool:
    """Same float dtype (float32/64) everywhere and C order, so flat chunks line up."""
    dt = p.dtype
    return (
        dt in _CHUNKED_DTYPES
        and g.dtype == dt
        and m.dtype == dt
        and v.dtype == dt
        and p.flags.c_contiguous
        and m.flags.c_contiguous
        and v.flags.c_contiguous
    )


def _adam_chunked(
    p: Array, g: Array, m: Array, v: Array, out: tuple[Array, Array, Array],
    lr: float, bc1: float, bc2: float, beta1: float, beta2: float, eps: float,
    weight_decay: float, decoupled: bool,
) -> None:  # fmt: skip
    """The update of ``_adam_whole`` (same passes, same order, same scalars), one L2-sized
    chunk at a time, chunks spread over the engine's threads."""
    flats = (p.reshape(-1), g.reshape(-1), m.reshape(-1), v.reshape(-1),
             out[0].reshape(-1), out[1].reshape(-1), out[2].reshape(-1))  # fmt: skip
    size = p.size
    decay = 1 - lr * weight_decay if weight_decay and decoupled else None
    hyper = (beta1, beta2, bc2, eps, lr / bc1, weight_decay if not decoupled else 0.0, decay)
    copy_p = out[0] is not p
    spans = shares(size, min(threads(), -(-size // ADAM_CHUNK)), SPAN_ALIGN)

    def run(span: tuple[int, int]) -> None:
        scratch = np.empty(ADAM_CHUNK, p.dtype)
        for a in range(span[0], span[1], ADAM_CHUNK):
            _adam_span(flats, a, min(a + ADAM_CHUNK, span[1]), scratch, hyper, copy_p)

    run_parallel(run, spans, size * ADAM_PASSES)


def _adam_small_in_place(
    p: Array, g: Array, m: Array, v: Array, lr: float, bc1: float, bc2: float,
    beta1: float, beta2: float, eps: float, weight_decay: float, decoupled: bool,
) -> None:  # fmt: skip
    """``_adam_whole``'s passes written into p, m and v themselves (same order, same bits)."""
    if weight_decay and not decoupled:
        g = g + weight_decay * p
    m *= beta1
    tmp = g * (1 - beta1)
    m += tmp
    v *= beta2
    np.multiply(g, g, out=tmp)
    tmp *= 1 - beta2
    v += tmp
    np.divide(v, bc2, out=tmp)
    np.sqrt(tmp, out=tmp)
    tmp += eps
    np.divide(m, tmp, out=tmp)
    tmp *= lr / bc1
    if weight_decay and decoupled:
        p *= 1 - lr * weight_decay
    p -= tmp


def _adam_span(flats: Any, a: int, b: int, scratch: Any, hyper: Any, copy_p: Any) -> None:
    """Elements [a, b) of the flat (p, g, m, v, p out, m out, v out)."""
    beta1, beta2, bc2, eps, step, l2, decay = hyper
    pc, gc, mc, vc, po, mo, vo = (f[a:b] for f in flats)
    tmp = scratch[: b - a]
    if l2:  # g + weight_decay * p, as the whole form computes it (Adam's L2 penalty)
        gc = gc + l2 * pc
    np.multiply(mc, beta1, out=mo)
    np.multiply(gc, 1 - beta1, out=tmp)
    mo += tmp
    np.multiply(vc, beta2, out=vo)
    np.multiply(gc, gc, out=tmp)
    tmp *= 1 - beta2
    vo += tmp
    np.divide(vo, bc2, out=tmp)
    np.sqrt(tmp, out=tmp)
    tmp += eps
    np.divide(mo, tmp, out=tmp)
    tmp *= step
    if decay is not None:
        np.multiply(pc, decay, out=po)
    elif copy_p:
        po[...] = pc
    po -= tmp


def _adam_whole(
    p: Array, g: Array, m: Array, v: Array, lr: Array, bc1: Array,
    bc2: Array, beta1: float, beta2: float, eps: float, weight_decay: float,
    decoupled: bool, xp: ModuleType,
) -> tuple[Array, Array, Array]:  # fmt: skip
    """Written with one scratch buffer and in-place updates, scalars folded on the host: the
    form for CuPy arrays and for dtypes the chunked form does not take (bfloat16, mixed)."""
    if xp is np:  # Python floats: NumPy keeps the arrays' dtype (weak scalars) and is fastest
        lr, bc1, bc2 = float(lr), float(bc1), float(bc2)
    else:
        lr, bc1, bc2 = (a.astype(p.dtype) for a in (lr, bc1, bc2))
    if not g.flags.c_contiguous:  # a transposed weight gradient: one copy beats ~14 strided passes
        g = xp.ascontiguousarray(g)
    if weight_decay and not decoupled:
        g = g + weight_decay * p
    m2 = m * beta1
    tmp = g * (1 - beta1)
    m2 += tmp
    v2 = v * beta2
    xp.multiply(g, g, out=tmp)
    tmp *= 1 - beta2
    v2 += tmp
    xp.divide(v2, bc2, out=tmp)
    xp.sqrt(tmp, out=tmp)
    tmp += eps
    xp.divide(m2, tmp, out=tmp)
    tmp *= lr / bc1
    p2 = p * (1 - lr * weight_decay) if weight_decay and decoupled else p.copy()
    p2 -= tmp
    return p2, m2, v2


def _sgd_update(
    p: Array, g: Array, buf: Array, lr: Array, momentum: float, dampening: float,
    nesterov: bool, weight_decay: float,
) -> tuple[Array, Array]:  # fmt: skip
    lr = lr.astype(p.dtype)
    if weight_decay:
        g = g + weight_decay * p
    if momentum:
        buf2 = buf * momentum
        buf2 += (1 - dampening) * g
        step = g + momentum * buf2 if nesterov else buf2
    else:
        buf2, step = buf, g
    return p - lr * step, buf2


OPTIM_KERNELS: dict[str, Callable[..., Any]] = {
    "adam_update": _adam_update,
    "sgd_update": _sgd_update,
}
"""Op name -> kernel, for ``numpy_kernels.KERNELS``."""
