"""Replicas of a model and its optimizer on other devices, and moving state between them.

A replica is a deep copy of the (model, optimizer) pair, made in one `copy.deepcopy` so the
copied optimizer points at the copied parameters, then moved to its device (server to server
when both are remote). Optimizer state is keyed by `id(parameter)`, which a copy changes, so
it is re-keyed by position. Group settings (learning rate, ...) are the same dict objects as
rank 0's: an `lr_scheduler` stepping rank 0's optimizer changes every replica's learning rate,
so replicas cannot drift apart through Python state.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from ._tensor import Tensor


@dataclass
class Replica:
    """One rank: its device, model and optimizer (None when the user passed none)."""

    rank: int
    device: Any
    model: Any
    optimizer: Any = None

    def __repr__(self) -> str:
        return f"Replica(rank={self.rank}, device={self.device})"


def optimizer_params(opt: Any) -> list[Tensor]:
    """The optimizer's parameters in group order: the order its state is matched by."""
    return [p for g in opt.groups for _, p in g.params]


def state_tensors(model: Any, opt: Any) -> list[Tensor]:
    """Every tensor a step may change, in a fixed order: the model's parameters and buffers
    (frozen ones too), then each optimizer slot by parameter position and slot name."""
    out = [t for _, t in model.named_tensors()]
    seen = {id(t) for t in out}
    out += [t for _, t in model.named_buffers() if id(t) not in seen]
    if opt is not None:
        for p in optimizer_params(opt):
            slots = opt.state.get(id(p), {})
            out += [slots[k] for k in sorted(slots)]
    return out


def _move(t: Tensor, device: Any) -> None:
    if t.device is not device:
        t._assign(t.to(device))


def replicate(model: Any, opt: Any, device: Any, rank: int) -> Replica:
    """A copy of (model, opt) on `device`, equal to the original bit for bit."""
    model_r, opt_r = copy.deepcopy((model, opt))
    for _, t in model_r.named_tensors():
        t.grad = None
    model_r.to(device)  # parameters and every buffer, the same objects
    if opt_r is not None:
        mine, theirs = optimizer_params(opt), optimizer_params(opt_r)
        state = {}
        for p, p_r in zip(mine, theirs):
            slots = opt_r.state.get(id(p))
            if slots:
                for t in slots.values():
                    _move(t, device)
                state[id(p_r)] = slots
        opt_r.state = state
        for g, g_r in zip(opt.groups, opt_r.groups):
            g_r.settings = g.settings  # shared: a scheduler on rank 0 steers every replica
            g_r.bindings = {}
        opt_r.defaults = opt.defaults
    return Replica(rank, device, model_r, opt_r)


def adopt(dst: Replica, src: Replica) -> None:
    """Make `dst`'s tensor objects hold `src`'s values (and device): how the user's own model
    and optimizer stay rank 0 after the replica that held them is gone."""
    for (_, a), (_, b) in zip(dst.model.named_tensors(), src.model.named_tensors()):
        a._assign(b)
        a.grad = None
    if dst.optimizer is not None:
        state = {}
        for p, p_r in zip(optimizer_params(dst.optimizer), optimizer_params(src.optimizer)):
            slots = src.optimizer.state.get(id(p_r))
            if slots:
                state[id(p)] = {k: v.detach() for k, v in slots.items()}
        dst.optimizer.state = state
        dst.optimizer.steps = src.optimizer.steps
    dst.device = src.device


__all__ = ["Replica", "adopt", "optimizer_params", "replicate", "state_tensors"]
