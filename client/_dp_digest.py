"""Digests of a replica's tensors, to prove the replicas identical bit for bit.

sha256 over each tensor's bytes, read from the device in one transfer per dtype (the tensors
flattened and concatenated there): floats reduced in another order on another backend would
make any on-device checksum differ, bytes never do.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ._autograd import no_grad
from ._dp_replicate import Replica, optimizer_params
from ._ops import call


class ReplicaDivergence(RuntimeError):
    """`check_in_sync` found a replica whose parameters differ from rank 0's."""

    def __init__(self, message: str, rank: int, device: Any, name: str) -> None:
        super().__init__(message)
        self.rank, self.device, self.name = rank, device, name


def digests(rep: Replica, optimizer: bool) -> list[tuple[str, str]]:
    """(name, sha256 hex) of every tensor of the replica, read in one transfer per dtype."""
    named = list(rep.model.named_tensors())
    if optimizer and rep.optimizer is not None:
        opt = rep.optimizer
        names = {id(t): n for n, t in named}  # the model's names (an optimizer over bare
        # tensors calls them param.0, param.1 ...)
        for p in optimizer_params(opt):
            for slot, t in sorted(opt.state.get(id(p), {}).items()):
                named.append((f"optimizer.{names[id(p)]}.{slot}", t))
    by_dtype: dict[str, list[int]] = {}
    for k, (_, t) in enumerate(named):
        by_dtype.setdefault(t.dtype, []).append(k)
    out: list[tuple[str, str] | None] = [None] * len(named)
    with no_grad():
        for positions in by_dtype.values():
            flat = [named[k][1].reshape(-1) for k in positions]
            arr = (flat[0] if len(flat) == 1 else call("cat", *flat, axis=0)).numpy()
            start = 0
            for k in positions:
                n = int(named[k][1].size)
                out[k] = (named[k][0], hashlib.sha256(arr[start : start + n].tobytes()).hexdigest())
                start += n
    return out  # type: ignore[return-value]


__all__ = ["ReplicaDivergence", "digests"]
