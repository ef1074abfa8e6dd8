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
    grads = [(t, t.grad) for _, t in named_params(params) if t.grad is not None]
    if not grads:
        return None
    dev = grads[0][0].device
    with no_grad():
        squares = [(g32 * g32).sum() for g32 in (g.cast("float32") for _, g in grads)]
        total = squares[0]
        for sq in squares[1:]:
            total = total + sq
        norm = total.sqrt()
        scale = call("minimum", const(dev, 1.0, "float32"), max_norm / (norm + eps))
        for p, g in grads:
            p.grad = g * scale.cast(g.dtype)
    return norm
