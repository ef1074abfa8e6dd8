"""Splitting a whole batch into one shard per replica, and each shard's weight.

The client holds the whole batch as host arrays (what a data loader yields); each replica
gets a contiguous slice along axis 0, uploaded straight to its own device. Shards are as even
as possible (sizes differ by at most one, larger ones first, as `numpy.array_split`), and
each replica's gradient is weighted by its share of the batch, `n_r / N`, before the sum
across replicas: for a loss that is a mean over samples this makes the averaged gradient the
whole batch's gradient exactly (up to summation order), also for uneven batches. Passing
`even=True` refuses uneven batches instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._tensor import Tensor

MIN_SHARD = 1
"""Samples every replica must get: an empty shard has no mean loss to take a gradient of."""


class ShardError(ValueError):
    """The batch cannot be split as documented; the message names the argument."""


@dataclass(frozen=True)
class Shards:
    """One call's arguments cut for each replica, with each shard's size and weight."""

    args: list[tuple]
    """Per replica: its arguments, batch arrays replaced by its slice (host arrays)."""
    kwargs: list[dict[str, Any]]
    sizes: list[int]
    """Samples per replica."""
    total: int


def shard_sizes(total: int, replicas: int, even: bool = False) -> list[int]:
    """Contiguous shard sizes, larger first; raises ShardError when it cannot split."""
    if total < replicas * MIN_SHARD:
        raise ShardError(
            f"a batch of {total} samples cannot be split across {replicas} replicas: each "
            f"needs at least {MIN_SHARD}; use a batch of at least {replicas * MIN_SHARD}"
        )
    base, extra = divmod(total, replicas)
    if even and extra:
        raise ShardError(
            f"a batch of {total} samples does not split evenly across {replicas} replicas "
            f"(even_shards=True); use a multiple of {replicas}, or even_shards=False to weight "
            "each replica's gradient by its shard size"
        )
    return [base + 1 if r < extra else base for r in range(replicas)]


def _is_batch(x: Any) -> bool:
    """An array-like with a leading axis: NumPy arrays, torch tensors, anything with
    `__array__` and a shape. Python numbers, strings, None stay whole."""
    if isinstance(x, Tensor):
        return False
    shape = getattr(x, "shape", None)
    return shape is not None and hasattr(x, "__array__") and len(shape) >= 1


def _leaves(obj: Any, path: str, found: list[tuple[str, Any]]) -> None:
    if isinstance(obj, Tensor):
        raise ShardError(
            f"{path} is a burn_remote Tensor on {obj.device}: DataParallel splits host arrays "
            "(NumPy, torch) and uploads each shard to its replica; pass the array itself"
        )
    if _is_batch(obj):
        found.append((path, obj))
    elif isinstance(obj, list | tuple):
        for i, x in enumerate(obj):
            _leaves(x, f"{path}[{i}]", found)
    elif isinstance(obj, dict):
        for k, x in obj.items():
            _leaves(x, f"{path}[{k!r}]", found)


def _cut(obj: Any, start: int, stop: int) -> Any:
    if _is_batch(obj):
        arr = obj if isinstance(obj, np.ndarray) else np.asarray(obj)
        return arr[start:stop]
    if isinstance(obj, tuple) and hasattr(type(obj), "_fields"):
        return type(obj)(*[_cut(x, start, stop) for x in obj])
    if isinstance(obj, list | tuple):
        return type(obj)(_cut(x, start, stop) for x in obj)
    if isinstance(obj, dict):
        return {k: _cut(x, start, stop) for k, x in obj.items()}
    return obj


def split_batch(args: tuple, kwargs: dict[str, Any], replicas: int, even: bool = False) -> Shards:
    """Cut every array argument (at any depth of lists, tuples and dicts) along axis 0; other
    arguments go to every replica as they are.

    Raises:
        ShardError: no array argument, arrays of different lengths, a batch too small for
            the replicas, an uneven batch with `even`, or a burn_remote Tensor argument.
    """
    found: list[tuple[str, Any]] = []
    for i, a in enumerate(args):
        _leaves(a, f"argument {i}", found)
    for k, a in kwargs.items():
        _leaves(a, f"argument {k!r}", found)
    if not found:
        raise ShardError(
            "no batch to split: DataParallel needs at least one array argument (NumPy or "
            "torch) whose axis 0 is the batch"
        )
    total = int(found[0][1].shape[0])
    for path, x in found[1:]:
        if int(x.shape[0]) != total:
            raise ShardError(
                f"{path} has {x.shape[0]} samples along axis 0, {found[0][0]} has {total}: "
                "every array argument is split along axis 0, so they must agree"
            )
    sizes = shard_sizes(total, replicas, even)
    out_args, out_kwargs, start = [], [], 0
    for n in sizes:
        out_args.append(tuple(_cut(a, start, start + n) for a in args))
        out_kwargs.append({k: _cut(a, start, start + n) for k, a in kwargs.items()})
        start += n
    return Shards(out_args, out_kwargs, sizes, total)


__all__ = ["MIN_SHARD", "ShardError", "Shards", "shard_sizes", "split_batch"]
