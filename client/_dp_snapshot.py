"""Snapshots of the replicas' state, held on their devices: what `rebuild` goes back to.

A snapshot keeps the device tensor ids of every parameter, buffer and optimizer slot as they
were at a moment every replica was known good, so the next step cannot overwrite them in
place (one extra copy per device, no transfer). The ids are retained without Tensor objects:
step capture finds state among the live Tensors of a device, and must not mistake a
snapshot's handle for the state the step reads.
"""

from __future__ import annotations

from ._dp_replicate import Replica, optimizer_params
from ._tensor import Tensor, make_tensor


class _Held:
    """A device tensor id kept alive without a Tensor object: step capture looks for state
    among live Tensors, so a snapshot must not add holders it would mistake for state."""

    __slots__ = ("dev", "id", "shape", "dtype")

    def __init__(self, t: Tensor) -> None:
        self.dev, self.id, self.shape, self.dtype = t._dev, t._id, t.shape, t.dtype
        self.dev._rec.retain(self.id)

    def tensor(self) -> Tensor:
        return make_tensor(self.dev, self.id, self.shape, self.dtype)

    def release(self) -> None:
        if self.dev is not None:
            self.dev._rec.release(self.id)
            self.dev = None


class _Snapshot:
    """One replica's state at a moment it was known good: holding the ids keeps the values
    on the device (the next step cannot overwrite them in place; one extra copy)."""

    __slots__ = ("tensors", "slots", "steps")

    def __init__(self, rep: Replica) -> None:
        self.tensors = [_Held(t) for _, t in rep.model.named_tensors()]
        self.slots: list[dict[str, _Held]] = []
        self.steps = 0
        if rep.optimizer is not None:
            for p in optimizer_params(rep.optimizer):
                slots = rep.optimizer.state.get(id(p), {})
                self.slots.append({k: _Held(v) for k, v in slots.items()})
            self.steps = rep.optimizer.steps

    def restore(self, rep: Replica) -> None:
        for (_, t), held in zip(rep.model.named_tensors(), self.tensors):
            t._assign(held.tensor())
            t.grad = None
        opt = rep.optimizer
        if opt is not None:
            opt.state = {
                id(p): {k: v.tensor() for k, v in slots.items()}
                for p, slots in zip(optimizer_params(opt), self.slots)
                if slots
            }
            opt.steps = self.steps

    def release(self) -> None:
        for h in self.tensors:
            h.release()
        for slots in self.slots:
            for h in slots.values():
                h.release()

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # interpreter shutdown
            pass


__all__ = ["_Snapshot"]
