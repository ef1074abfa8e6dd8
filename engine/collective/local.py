"""A group of local replicas (several devices in one process): a rendezvous in memory.

Each replica runs its graphs on a worker thread of its own (the client's replica runtime),
so the k-th ``all_reduce`` of every rank meets here concurrently: the last rank to arrive
checks that all gave the same shape, dtype and op, sums in rank order (once, so every rank
gets the same bits), and wakes the others, who each take a copy. A rank that does not
arrive within the group's timeout, or a group closed while ranks wait, fails the group:
every waiting rank, and every later call, raises ``GroupFailure``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._errors import GroupFailure
from .ring import finish


@dataclass
class _Round:
    inputs: dict[int, tuple[np.ndarray, str]] = field(default_factory=dict)
    result: np.ndarray | None = None
    taken: int = 0


class LocalGroup:
    """The shared state of one group of local replicas (ranks 0..size-1)."""

    def __init__(self, group_id: int, names: list[str], timeout: float) -> None:
        self.id = group_id
        self.names = names
        """Rank -> the name errors give it (``local:<k>``)."""
        self.timeout = timeout
        self.failure: GroupFailure | None = None
        self._cond = threading.Condition()
        self._rounds: dict[int, _Round] = {}
        self.members = [LocalMember(self, rank) for rank in range(len(names))]

    @property
    def size(self) -> int:
        return len(self.names)

    def fail(self, rank: int, reason: str) -> GroupFailure:
        """Mark the group failed (first failure wins) and wake every waiting rank."""
        with self._cond:
            if self.failure is None:
                self.failure = GroupFailure(self.id, rank, self.names[rank] if rank >= 0 else "",
                                            reason)  # fmt: skip
            self._cond.notify_all()
            return self.failure

    def close(self) -> None:
        self.fail(-1, "the group was closed")

    def exchange(self, rank: int, seq: int, host: np.ndarray, op: str) -> np.ndarray:
        with self._cond:
            if self.failure is not None:
                raise self.failure
            rnd = self._rounds.setdefault(seq, _Round())
            rnd.inputs[rank] = (host, op)
            if len(rnd.inputs) == self.size:
                self._reduce(seq, rnd)
            elif not self._cond.wait_for(
                lambda: rnd.result is not None or self.failure is not None, self.timeout
            ):
                late = min(set(range(self.size)) - set(rnd.inputs))
                self.failure = GroupFailure(
                    self.id, late, self.names[late],
                    f"did not reach all_reduce #{seq} within {self.timeout:g} s",
                )  # fmt: skip
                self._cond.notify_all()
            if self.failure is not None:
                raise self.failure
            assert rnd.result is not None
            rnd.taken += 1
            if rnd.taken == self.size:
                del self._rounds[seq]
            return rnd.result if rnd.taken == self.size else rnd.result.copy()

    def _reduce(self, seq: int, rnd: _Round) -> None:
        (first, op0) = rnd.inputs[0]
        for r in range(1, self.size):
            a, op = rnd.inputs[r]
            if a.shape != first.shape or a.dtype != first.dtype or op != op0:
                self.failure = GroupFailure(
                    self.id, r, self.names[r],
                    f"all_reduce #{seq} got {a.dtype}{list(a.shape)} op={op} from this rank "
                    f"but {first.dtype}{list(first.shape)} op={op0} from rank 0",
                )  # fmt: skip
                self._cond.notify_all()
                return
        acc = np.array(first, copy=True)
        for r in range(1, self.size):
            np.add(acc, rnd.inputs[r][0], out=acc)
        rnd.result = finish(acc, op0, self.size)
        self._cond.notify_all()


class LocalMember:
    """One replica's end: counts its collectives so the k-th of every rank meet."""

    def __init__(self, group: LocalGroup, rank: int) -> None:
        self.group, self.rank = group, rank
        self._seq = 0

    def all_reduce(self, x: Any, op: str, backend: Any) -> Any:
        seq, self._seq = self._seq, self._seq + 1
        host = np.asarray(backend.to_numpy(x))
        return backend.from_numpy(self.group.exchange(self.rank, seq, host, op))


__all__ = ["LocalGroup", "LocalMember"]
