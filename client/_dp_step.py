"""One data-parallel step: the function each replica captures, and its combined result.

Each replica gets a `br.compile` of the same body: run the user's step with the replica's
model and optimizer under the gradient reducer's backward hook, give every replica rank 0's
value of each buffer the step changed (BatchNorm's running statistics: PyTorch DDP's
`broadcast_buffers`, so replicas stay identical), then combine what it returns across
replicas the way gradients are (a loss that a backward started from is already combined: it
rode in a gradient bucket). The shard's weight is a float argument, so it is a
binding of the captured graph, not a constant.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ._autograd import backward_hook, no_grad
from ._compile import compile as _compile
from ._dp_grads import REDUCED_FLOATS, GradientReducer, broadcast_from_rank0, reduce_tensors
from ._dp_replicate import Replica
from ._tensor import Tensor

if TYPE_CHECKING:
    from ._dataparallel import DataParallel


class DataParallelStep:
    """A step compiled for every replica (see `DataParallel.compile`)."""

    def __init__(self, dp: DataParallel, fn: Callable[..., Any]) -> None:
        self.dp = dp
        self.fn = fn
        self.name = getattr(fn, "__qualname__", repr(fn))
        self._compiled: dict[int, Any] = {}
        """id(replica) -> its Compiled body."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.dp._run(self, args, kwargs)

    def reset(self) -> None:
        """Forget every replica's capture (the group changed: the all_reduce's group id is
        part of the graph)."""
        for c in self._compiled.values():
            c.reset()
        self._compiled.clear()

    def stats(self) -> dict[str, int]:
        """Recordings and replays summed over replicas."""
        out = {"recordings": 0, "replays": 0, "captures": 0}
        for c in self._compiled.values():
            for k, v in c.stats().items():
                out[k] += v
        return out

    def _for(self, rep: Replica) -> Any:
        c = self._compiled.get(id(rep))
        if c is None:
            c = self._compiled[id(rep)] = _compile(_body(self, rep), device=rep.device)
        return c


def _body(step: DataParallelStep, rep: Replica) -> Callable[..., Any]:
    dp, fn = step.dp, step.fn

    def data_parallel_step(args: tuple, kwargs: dict[str, Any], weight: Tensor) -> Any:
        reducer = GradientReducer(rep.model.parameters(), weight, dp.group, dp.bucket_bytes)
        buffers = list(rep.model.named_buffers())
        before = [t._id for _, t in buffers]
        with backward_hook(reducer):
            result = fn(rep.model, rep.optimizer, *args, **kwargs)
        changed = [t for (_, t), was in zip(buffers, before) if t._id != was]
        if changed and dp.group is not None:  # BatchNorm's running statistics
            with no_grad():
                for t, v in zip(changed, broadcast_from_rank0(changed, rep.rank == 0, dp.group)):
                    t._assign(v)
        return _combine(result, reducer, weight, dp.group, dp.bucket_bytes, step.name)

    data_parallel_step.__qualname__ = f"DataParallel({step.name})"
    return data_parallel_step


def _combine(
    result: Any, reducer: GradientReducer, weight: Tensor, group: Any, limit: int, name: str
) -> Any:
    """The step's result with every tensor combined across replicas like the gradients (a
    loss that a backward started from is already combined: it rode in a gradient bucket)."""
    leaves: list[Tensor] = []
    spec = _tree(result, leaves)
    if not leaves:
        return result
    todo = []
    for k, t in enumerate(leaves):
        if t.dtype not in REDUCED_FLOATS:
            raise TypeError(
                f"DataParallel step {name} returns a {t.dtype} tensor: results are combined "
                "across replicas like gradients (weighted mean or sum), so return float "
                "tensors (a count: .float(), with loss_reduction='sum' or as a mean)"
            )
        if t._id not in reducer.losses:
            todo.append(k)
    with no_grad():
        done = reduce_tensors([leaves[k].detach() for k in todo], weight, group, limit)
    combined = list(leaves)
    for k, v in zip(todo, done):
        combined[k] = v
    for k, t in enumerate(leaves):
        if t._id in reducer.losses:
            combined[k] = reducer.losses[t._id]
    return _untree(spec, iter(combined))


def _tree(obj: Any, leaves: list[Tensor]) -> Any:
    if isinstance(obj, Tensor):
        leaves.append(obj)
        return None
    if isinstance(obj, list | tuple):
        return (type(obj), [_tree(x, leaves) for x in obj])
    if isinstance(obj, dict):
        return (dict, {k: _tree(x, leaves) for k, x in obj.items()})
    return ("=", obj)


def _untree(spec: Any, leaves: Any) -> Any:
    if spec is None:
        return next(leaves)
    kind, body = spec
    if kind == "=":
        return body
    if kind is dict:
        return {k: _untree(s, leaves) for k, s in body.items()}
    items = [_untree(s, leaves) for s in body]
    return kind(*items) if hasattr(kind, "_fields") else kind(items)


def _upload(obj: Any, dev: Any) -> Any:
    """Host arrays -> tensors on `dev` (the shard's values), structures kept."""
    if isinstance(obj, np.ndarray) or (hasattr(obj, "__array__") and hasattr(obj, "shape")):
        return dev.tensor(obj)
    if isinstance(obj, tuple) and hasattr(type(obj), "_fields"):
        return type(obj)(*[_upload(x, dev) for x in obj])
    if isinstance(obj, list | tuple):
        return type(obj)(_upload(x, dev) for x in obj)
    if isinstance(obj, dict):
        return {k: _upload(x, dev) for k, x in obj.items()}
    return obj


__all__ = ["DataParallelStep"]
