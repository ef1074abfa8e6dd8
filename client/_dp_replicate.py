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

from ._autograd import no_grad
from ._ops import call
from ._tensor import Tensor

MOVE_BUCKET_BYTES = 256 * 1024 * 1024
"""Largest flat tensor one replication transfer carries. Tensors are moved flattened and
concatenated per dtype: one server-to-server move (one capability, one bulk stream) per
bucket instead of one per tensor (a GPT has hundreds, and a session may hold only so many
unredeemed capabilities at once)."""


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


def move_all(tensors: list[Tensor], device: Any, limit: int = MOVE_BUCKET_BYTES) -> None:
    """Move every tensor to `device` in place (the same objects), in few transfers."""
    from ._dp_grads import _buckets

    away = [t for t in tensors if t.device is not device]
    by_source: dict[int, list[Tensor]] = {}
    for t in away:
        by_source.setdefault(id(t.device), []).append(t)
    with no_grad():
        for group in by_source.values():
            for bucket in _buckets(group, limit):
                parts = [group[k] for k in bucket]
                if len(parts) == 1:
                    parts[0]._assign(parts[0].to(device))
                    continue
                flat = call("cat", *[p.reshape(-1) for p in parts], axis=0).to(device)
                start = 0
                for p in parts:
                    n = int(p.size)
                    p._assign(flat[start : start + n].reshape(p.shape))
                    start += n


def replicate(model: Any, opt: Any, device: Any, rank: int) -> Replica:
    """A copy of (model, opt) on `device`, equal to the original bit for bit."""
    model_r, opt_r = copy.deepcopy((model, opt))
    for _, t in model_r.named_tensors():
        t.grad = None
    tensors = [t for _, t in model_r._named(("_params", "_buffers"), persistent_only=False)]
    if opt_r is not None:
        mine, theirs = optimizer_params(opt), optimizer_params(opt_r)
        state = {}
        for p, p_r in zip(mine, theirs):
            slots = opt_r.state.get(id(p))
            if slots:
                tensors += list(slots.values())
                state[id(p_r)] = slots
        opt_r.state = state
        for g, g_r in zip(opt.groups, opt_r.groups):
            g_r.settings = g.settings  # shared: a scheduler on rank 0 steers every replica
            g_r.bindings = {}
        opt_r.defaults = opt.defaults
    move_all(tensors, device)
    return Replica(rank, device, model_r, opt_r)


def adopt(dst: Replica, src: Replica) -> None:
    """Make `dst`'s tensor objects hold `src`'s values (and device): how the user's own model
    and optimizer stay rank 0 after the replica that held them is gone."""
    every = ("_params", "_buffers")  # non-persistent buffers too (a GPT's causal mask)
    for (_, a), (_, b) in zip(
        dst.model._named(every, persistent_only=False),
        src.model._named(every, persistent_only=False),
    ):
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


__all__ = [
    "MOVE_BUCKET_BYTES",
    "Replica",
    "adopt",
    "move_all",
    "optimizer_params",
    "replicate",
    "state_tensors",
]
