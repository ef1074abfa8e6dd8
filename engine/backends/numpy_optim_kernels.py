"""The optimizers' fused update kernels (``adam_update``, ``sgd_update``), which
``numpy_kernels`` registers into its ``KERNELS`` (NumPy and, through ``array_module``, CuPy
arrays): one call per parameter per step, so each is written for the fewest passes over
memory."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .array_module import array_module as _mod


def _adam_update(p, g, m, v, lr, bc1, bc2, beta1, beta2, eps, weight_decay, decoupled):
    """Written with one scratch buffer and in-place updates, scalars folded on the host: this
    runs once per parameter per step, so its per-call cost is most of an optimizer step."""
    if p.ndim == 0:  # a scalar parameter: NumPy's 0-d arithmetic gives scalars, not buffers
        one = _adam_update(
            p.reshape(1), g.reshape(1), m.reshape(1), v.reshape(1),
            lr, bc1, bc2, beta1, beta2, eps, weight_decay, decoupled,
        )  # fmt: skip
        return tuple(a.reshape(()) for a in one)
    xp = _mod(p)
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


def _sgd_update(p, g, buf, lr, momentum, dampening, nesterov, weight_decay):
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
