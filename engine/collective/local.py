"""A group of local replicas (several devices in one process): a rendezvous in memory.

Each replica runs its graphs on a worker thread of its own (the client's replica runtime),
so the k-th ``all_reduce`` of every rank meets here concurrently: the last rank to arrive
checks that all gave the same shape, dtype and op, sums in rank order (once, so every rank
gets the same bits), and wakes the others, who each take a copy. A group closed while ranks
wait fails the group: every waiting rank, and every later call, raises ``GroupFailure``.

Lateness is judged by progress, not by the clock alone: a rank still being recorded by the
client thread, or whose worker is still computing the graph that leads to the collective, is
alive and is waited for however long that takes (a 124M-parameter step on a loaded machine
can take minutes). A missing rank is declared late only when it has shown no progress for the
group's timeout -- nothing recorded or queued for it, and no CPU time used by a thread acting
for it (its worker while running a job, a client thread inside ``Liveness.acting``). That is
the local twin of the servers' link heartbeats: a frozen or deadlocked rank goes quiet, a
busy one does not. A rank whose work failed before the collective (an op error, memory
running out) and that has nothing else to run will not come at all: it is named at once,
with its error. A thread waiting at a rendezvous does not count as progress, so two ranks
waiting for each other (different sequences of calls) still fail.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._errors import GroupFailure
from .ring import finish

PROGRESS_CHECK = 0.5
"""Seconds between a waiting rank's looks at the missing ranks' progress (at most; a shorter
group timeout checks four times per timeout)."""


def _thread_cpu_ns(ident: int) -> int:
    """CPU time a live thread of this process has used (0 where the OS cannot tell)."""
    try:
        return time.clock_gettime_ns(time.pthread_getcpuclockid(ident))
    except (AttributeError, OSError):  # no per-thread CPU clocks on this platform
        return 0


class Liveness:
    """How one rank shows it is alive and working (see the module docstring).

    ``touch()`` counts an event (an op recorded, work queued, a job finished); ``acting()``
    marks the calling thread as working for this rank, so its CPU time counts as progress;
    ``waiting()`` marks it as blocked at a rendezvous, so it does not. ``progress()`` is a
    token that changes whenever the rank made progress.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events = 0
        self._actors: dict[int, int] = {}
        """Thread ident -> nesting depth of ``acting`` (a registered thread is alive: it
        leaves under the lock, so reading its CPU clock is safe)."""
        self._blocked: dict[int, int] = {}
        self.failure: BaseException | None = None
        """Why this rank, idle after a failure, will not come (see ``failed``)."""

    def touch(self) -> None:
        self._events += 1  # a lost increment between threads only delays a verdict

    def failed(self, exc: BaseException | None) -> None:
        """Set by the rank's runtime while its work failed (the error kept for the client's
        next wait) and it has nothing left to run: it will not reach the collectives its
        partners wait at until the client gives it new work, so they fail at once, citing
        ``exc``. None: it has work again."""
        self.failure = exc

    def acting(self) -> contextlib.AbstractContextManager[None]:
        """While open, this thread works for the rank (its CPU counts as progress)."""
        return self._counted(self._actors)

    def waiting(self) -> contextlib.AbstractContextManager[None]:
        """While open, this thread waits at a rendezvous (its CPU is not progress)."""
        return self._counted(self._blocked)

    @contextlib.contextmanager
    def _counted(self, table: dict[int, int]) -> Iterator[None]:
        me = threading.get_ident()
        with self._lock:
            table[me] = table.get(me, 0) + 1
            self._events += 1
        try:
            yield
        finally:
            with self._lock:
                self._events += 1
                if table[me] == 1:
                    del table[me]
                else:
                    table[me] -= 1

    def progress(self) -> tuple[int, int]:
        """(events, CPU ns of the threads acting for this rank and not blocked)."""
        with self._lock:
            cpu = sum(_thread_cpu_ns(t) for t in self._actors if t not in self._blocked)
            return (self._events, cpu)


@dataclass
class _Round:
    inputs: dict[int, tuple[np.ndarray, str]] = field(default_factory=dict)
    result: np.ndarray | None = None
    taken: int = 0


class LocalGroup:
    """The shared state of one group of local replicas (ranks 0..size-1)."""

    def __init__(
        self,
        group_id: int,
        names: list[str],
        timeout: float,
        liveness: list[Liveness] | None = None,
    ) -> None:
        self.id = group_id
        self.names = names
        """Rank -> the name errors give it (``local:<k>``)."""
        self.timeout = timeout
        self.liveness = liveness or [Liveness() for _ in names]
        """Rank -> how it shows progress (its replica runtime's; fresh ones never change,
        so a rank without one is late ``timeout`` after the first arrival)."""
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
        with self.liveness[rank].waiting(), self._cond:
            if self.failure is not None:
                raise self.failure
            rnd = self._rounds.setdefault(seq, _Round())
            rnd.inputs[rank] = (host, op)
            if len(rnd.inputs) == self.size:
                self._reduce(seq, rnd)
            else:
                self._wait(seq, rnd)
            if self.failure is not None:
                raise self.failure
            assert rnd.result is not None
            rnd.taken += 1
            if rnd.taken == self.size:
                del self._rounds[seq]
            return rnd.result if rnd.taken == self.size else rnd.result.copy()

    def _wait(self, seq: int, rnd: _Round) -> None:
        """Until the round's result or a failure; fails the group naming a missing rank that
        made no progress for ``timeout`` seconds."""
        slice_s = max(0.01, min(PROGRESS_CHECK, self.timeout / 4))
        seen: dict[int, tuple[tuple[int, int], float]] = {}
        """Missing rank -> (its last progress token, when that token was first seen)."""
        while not self._cond.wait_for(
            lambda: rnd.result is not None or self.failure is not None, slice_s
        ):
            now = time.monotonic()
            for r in sorted(set(range(self.size)) - set(rnd.inputs)):
                failure = self.liveness[r].failure
                if failure is not None:
                    why = str(failure).strip().splitlines()
                    self._fail(
                        r,
                        f"will not reach all_reduce #{seq}: its work failed before it "
                        f"({type(failure).__name__}: {why[0] if why else ''})",
                    )
                    return
                token = self.liveness[r].progress()
                last = seen.get(r)
                if last is None or last[0] != token:
                    seen[r] = (token, now)
                elif now - last[1] >= self.timeout:
                    self._fail(
                        r,
                        f"did not reach all_reduce #{seq}: no progress (nothing recorded, "
                        f"queued or computed) for {self.timeout:g} s",
                    )
                    return

    def _fail(self, rank: int, reason: str) -> None:
        """The group fails because of ``rank`` (the condition's lock is held): every rank
        waiting here wakes to it."""
        self.failure = GroupFailure(self.id, rank, self.names[rank], reason)
        self._cond.notify_all()

    def _reduce(self, seq: int, rnd: _Round) -> None:
        (first, op0) = rnd.inputs[0]
        for r in range(1, self.size):
            a, op = rnd.inputs[r]
            if a.shape != first.shape or a.dtype != first.dtype or op != op0:
                self._fail(
                    r,
                    f"all_reduce #{seq} got {a.dtype}{list(a.shape)} op={op} from this rank "
                    f"but {first.dtype}{list(first.shape)} op={op0} from rank 0",
                )
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


__all__ = ["PROGRESS_CHECK", "Liveness", "LocalGroup", "LocalMember"]
