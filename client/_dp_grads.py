"""Gradient averaging across replicas, recorded into each replica's step graph.

When a replica's `backward()` returns, the gradients it produced are flattened into a few
buckets (one or more per dtype, each at most `BUCKET_BYTES`), each bucket is scaled by the
replica's share of the batch and summed across the group by one `collective.all_reduce` (the
servers reduce among themselves; nothing passes through the client), then cut back into the
parameters' `.grad`. Few large all-reduces cost far less than one per parameter (latency per
call, as in PyTorch DDP's 25 MiB buckets). Gradients that were already there before this
`backward` (accumulation over several backward calls) are set aside first and added back
after, so each backward's contribution is reduced exactly once.

The loss a backward starts from rides in the last bucket, so the step's loss comes back
averaged across replicas without a collective of its own.
"""

from __future__ import annotations

from typing import Any

from ._autograd import no_grad
from ._ops import call
from ._tensor import Tensor

BUCKET_BYTES = 25 * 1024 * 1024
"""Largest gradient bucket in bytes (PyTorch DDP's default): big enough that the per-call
latency of a ring all-reduce is paid a few times per step, small enough that the flat copy
does not double a large model's gradient memory at once."""

REDUCED_FLOATS = ("float16", "bfloat16", "float32", "float64")
"""Dtypes the gradients and combined results may have (the all_reduce op's float dtypes)."""


def _buckets(tensors: list[Tensor], limit: int) -> list[list[int]]:
    """Positions of `tensors` grouped by dtype, in order, each group cut at `limit` bytes."""
    by_dtype: dict[str, list[list[int]]] = {}
    sizes: dict[str, int] = {}
    for k, t in enumerate(tensors):
        nbytes = int(t.size) * _itemsize(t.dtype)
        groups = by_dtype.setdefault(t.dtype, [[]])
        if groups[-1] and sizes[t.dtype] + nbytes > limit:
            groups.append([])
            sizes[t.dtype] = 0
        groups[-1].append(k)
        sizes[t.dtype] = sizes.get(t.dtype, 0) + nbytes
    return [b for groups in by_dtype.values() for b in groups]


def _itemsize(dtype: str) -> int:
    return {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}.get(dtype, 8)


def reduce_tensors(
    tensors: list[Tensor], weight: Tensor, group: Any, limit: int = BUCKET_BYTES
) -> list[Tensor]:
    """sum over replicas of `weight * t`, for each tensor, bucketed; same shapes and dtypes.
    Every replica must call this with tensors of the same shapes and dtypes, in the same
    order (the collective's rule). `group` None: one replica, nothing to sum with."""
    out: list[Tensor | None] = [None] * len(tensors)
    for bucket in _buckets(tensors, limit):
        parts = [tensors[k] for k in bucket]
        dtype = parts[0].dtype
        if dtype not in REDUCED_FLOATS:
            raise TypeError(
                f"DataParallel averages float tensors; got {dtype} (shape {parts[0].shape})"
            )
        flat = (
            parts[0].reshape(-1)
            if len(parts) == 1
            else call("cat", *[p.reshape(-1) for p in parts], axis=0)
        )
        summed = flat * weight.cast(dtype)
        if group is not None:
            from . import collective

            summed = collective.all_reduce(summed, group, op="sum")
        start = 0
        for k, p in zip(bucket, parts):
            n = int(p.size)
            piece = summed if len(parts) == 1 else summed[start : start + n]
            out[k] = piece.reshape(p.shape)
            start += n
    return out  # type: ignore[return-value]


def broadcast_from_rank0(tensors: list[Tensor], root: bool, group: Any) -> list[Tensor]:
    """Rank 0's values of `tensors` on every replica (any numeric dtype), bucketed per dtype:
    rank 0 contributes its values and the others zeros to one summing all-reduce, so the sum
    is rank 0's exactly (never `x * 0`, which a NaN or an inf would survive)."""
    from . import collective

    out: list[Tensor | None] = [None] * len(tensors)
    for bucket in _buckets(tensors, BUCKET_BYTES):
        parts = [tensors[k] for k in bucket]
        total = sum(int(p.size) for p in parts)
        if root:
            flat = call("cat", *[p.reshape(-1) for p in parts], axis=0)
        else:
            flat = parts[0].device.zeros((total,), parts[0].dtype)
        summed = collective.all_reduce(flat, group, op="sum")
        start = 0
        for k, p in zip(bucket, parts):
            n = int(p.size)
            out[k] = summed[start : start + n].reshape(p.shape)
            start += n
    return out  # type: ignore[return-value]


class GradientReducer:
    """The backward hook of one replica's step (see `_autograd.backward_hook`)."""

    def __init__(self, params: list[Tensor], weight: Tensor, group: Any, limit: int) -> None:
        self.params = params
        self.weight = weight
        self.group = group
        self.limit = limit
        self.stash: list[Tensor | None] = []
        self.losses: dict[int, Tensor] = {}
        """id of a backward root -> its value combined across replicas."""

    def before(self, root: Tensor) -> None:
        """Called as ``backward(root)`` starts: set aside the gradients already accumulated, so that
        only this backward's own contribution is reduced across replicas."""
        self.stash = [p.grad for p in self.params]
        for p in self.params:
            p.grad = None

    def after(self, root: Tensor) -> None:
        """Called when ``backward(root)`` is done: all-reduce this backward's fresh gradients across
        the replicas, weighted by this rank's share of the batch (with a scalar float loss
        alongside, kept in ``losses``), then add them back onto the gradients set aside, as an
        accumulating backward would."""
        with no_grad():
            fresh = [(id(p), p.grad) for p in self.params if p.grad is not None]
            carry = root.size == 1 and root.dtype in REDUCED_FLOATS
            tensors = [g for _, g in fresh] + ([root.detach()] if carry else [])
            reduced = reduce_tensors(tensors, self.weight, self.group, self.limit)
            if carry:
                self.losses[root._id] = reduced.pop()
            done = {key: g for (key, _), g in zip(fresh, reduced)}
            for p, old in zip(self.params, self.stash):
                new = done.get(id(p))
                p.grad = old if new is None else (new if old is None else old + new)
        self.stash = []


__all__ = ["BUCKET_BYTES", "GradientReducer", "broadcast_from_rank0", "reduce_tensors"]
