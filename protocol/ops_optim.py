"""Fused optimizer updates: one op per parameter, so a training step records few nodes.

Learning rate and bias corrections arrive as 0-d inputs (graph bindings), so schedules and
step counts never change the graph's hash.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .registry import Shaped, ShapeError, Spec, declare
from .shapes import fmt


def _adam_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """inputs: p, g, m, v, lr, bc1, bc2
    refused: `not p.shape == g.shape == m.shape == v.shape or lr.shape != () or bc1.shape != ()
    or bc2.shape != ()`
    outputs: `(p.shape, p.dtype), (m.shape, m.dtype), (v.shape, v.dtype)`"""
    p, g, m, v, lr, bc1, bc2 = xs
    if not (p.shape == g.shape == m.shape == v.shape):
        raise ShapeError(
            f"adam_update: param {fmt(p.shape)}, grad {fmt(g.shape)} and moments "
            f"{fmt(m.shape)}, {fmt(v.shape)} must match"
        )
    if lr.shape or bc1.shape or bc2.shape:
        raise ShapeError("adam_update: lr and bias corrections must be 0-d")
    return [(p.shape, p.dtype), (m.shape, m.dtype), (v.shape, v.dtype)]


declare(
    "adam_update",
    "optim",
    7,
    attrs={"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0, "decoupled": True},
    infer=_adam_infer,
    n_outputs=3,
    doc=(
        "Inputs p, g, m, v, lr, bc1 = 1 - beta1**t, bc2 = 1 - beta2**t. With decoupled "
        "(AdamW): p *= 1 - lr * wd; otherwise g += wd * p (Adam's L2). Then "
        "m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2; "
        "p -= lr * (m / bc1) / (sqrt(v / bc2) + eps). Outputs (p, m, v)."
    ),
)


def _sgd_infer(xs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
    """inputs: p, g, buf, lr
    refused: `not p.shape == g.shape == buf.shape`
    outputs: `(p.shape, p.dtype), (buf.shape, buf.dtype)`"""
    p, g, buf, lr = xs
    if not (p.shape == g.shape == buf.shape):
        raise ShapeError(
            f"sgd_update: param {fmt(p.shape)}, grad {fmt(g.shape)}, buffer {fmt(buf.shape)} differ"
        )
    return [(p.shape, p.dtype), (buf.shape, buf.dtype)]


declare(
    "sgd_update",
    "optim",
    4,
    attrs={"momentum": 0.0, "dampening": 0.0, "nesterov": False, "weight_decay": 0.0},
    infer=_sgd_infer,
    n_outputs=2,
    doc=(
        "Inputs p, g, buf, lr. g += wd * p; buf = momentum * buf + (1 - dampening) * g; "
        "step = g + momentum * buf if nesterov else buf (g itself when momentum is 0); "
        "p -= lr * step. Outputs (p, buf)."
    ),
)
