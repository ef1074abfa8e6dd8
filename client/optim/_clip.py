"""Gradient clipping by global norm, computed on the device: no value comes back to the host,
so clipping adds ops to the step graph and never a round trip."""

from __future__ import annotations

from typing import Any

from .._autograd import no_grad
from .._ops import call, const
from .._tensor import Tensor
from ._groups import named_params


def clip_grad_norm(params: Any, max_norm: float, eps: float = 1e-6) -> Tensor | None:
    """Scale every gradient by min(1, max_norm / (norm + eps)); returns the (lazy) norm
    before clipping, or None when no parameter has a gradient."""
    grads = [t for _, t in named_params(params) if t.grad is not None]
    if not grads:
        return None
    dev = grads[0].device
    with no_grad():
        total = None
        for p in grads:
            g = p.grad.cast("float32")
            sq = (g * g).sum()
            total = sq if total is None else total + sq
        norm = total.sqrt()
        scale = call("minimum", const(dev, 1.0, "float32"), max_norm / (norm + eps))
        for p in grads:
            p.grad = p.grad * scale.cast(p.grad.dtype)
    return norm
