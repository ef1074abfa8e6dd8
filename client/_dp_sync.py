"""Waiting for every replica at once, and telling the dead from the survivors.

A step on a group either succeeds on every replica or fails on every survivor with the
collective's GroupError naming the culprit; the culprit itself may not answer at all (a
killed or frozen server answers nothing until the connection gives up, a minute later). So
the replicas are waited for concurrently, and the wait ends as soon as every rank is either
done or named dead by a survivor's GroupError.

A rank can also die while the group is idle: the others finished the step, the culprit never
answers, and no survivor is in a collective that would notice. After `PROBE_AFTER` seconds of
that, the caller's `probe` issues one tiny all-reduce on every rank: a live straggler joins it
when it catches up, a dead or cut-off one makes it fail on every survivor with a GroupError
naming it (the servers' link heartbeats; a local group's rendezvous timeout).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeGuard

if TYPE_CHECKING:
    from ._group_error import GroupError

PROBE_AFTER = 1.0
"""Seconds a rank may lag behind all the others (which answered) before the group is probed."""


@dataclass
class Outcome:
    """What waiting for the replicas found."""

    errors: dict[int, BaseException] = field(default_factory=dict)
    """rank -> the error its own device raised (GroupError on survivors; a connection error
    on a dead rank's own device, when it answered at all)."""
    dead: set[int] = field(default_factory=set)
    """Ranks named as the culprit by a GroupError, or whose own connection failed for good.
    Other errors (an op that failed the same way on every replica) kill no rank."""
    completed: set[int] = field(default_factory=set)
    """Ranks that ran everything they were given before any probe (their state is good)."""

    @property
    def ok(self) -> bool:
        """True when no replica raised and none is dead: the step stands on every rank."""
        return not self.errors and not self.dead


def _is_group_error(exc: BaseException) -> TypeGuard[GroupError]:
    from . import collective

    return isinstance(exc, collective.GroupError)


def _is_lost(exc: BaseException) -> bool:
    """The device's own connection failed for good (its server died or was cut off)."""
    return isinstance(exc, ConnectionError | TimeoutError)


class _Waits:
    """One thread per rank, each waiting for one `sync` of its device."""

    def __init__(self, devices: list[Any]) -> None:
        self.devices = devices
        self.lock = threading.Condition()
        self.errors: dict[int, BaseException] = {}
        self.done: set[int] = set()
        self.busy: set[int] = set()
        """Ranks whose thread is still inside `sync` (their device is in use)."""
        self.completed: set[int] = set()
        self.probed = False

    def start(self, ranks: list[int], waits: dict[int, Callable[[], None]] | None = None) -> None:
        """A thread per rank; it calls ``waits[rank]`` (the wait `collective.submit_all`
        gave), else waits for everything submitted to the device (`_wait_only`)."""
        for r in ranks:
            self.done.discard(r)
            self.busy.add(r)
            wait = (waits or {}).get(r) or functools.partial(_wait_only, self.devices[r])
            threading.Thread(
                target=self._wait, args=(r, wait), name=f"dp-wait-{r}", daemon=True
            ).start()

    def _wait(self, rank: int, wait: Callable[[], None]) -> None:
        try:
            wait()
            with self.lock:
                if not self.probed:
                    self.completed.add(rank)
        except BaseException as exc:  # reported to the caller, which raises
            with self.lock:
                self.errors[rank] = exc
        finally:
            with self.lock:
                self.done.add(rank)
                self.busy.discard(rank)
                self.lock.notify_all()

    def named(self) -> set[int]:
        return {int(e.rank) for e in self.errors.values() if _is_group_error(e)}

    def settled(self) -> bool:
        """Every rank answered or is named dead, and no thread but a dead rank's still uses
        its device (the caller goes on recording on the others)."""
        named = self.named()
        every = all(r in self.done or r in named for r in range(len(self.devices)))
        return every and self.busy <= named

    def stragglers(self) -> list[int]:
        """Ranks still waited for while every other rank answered without an error."""
        late = [r for r in range(len(self.devices)) if r not in self.done]
        if late and not self.errors and len(late) < len(self.devices):
            return late
        return []


def _wait_only(device: Any) -> None:
    """Wait until `device` ran everything submitted to it; raises its failures. Submits
    nothing: the waiting threads never touch a recorder (two of them flushing one rank --
    its own wait and a partner's `sync` flushing it -- once lost that rank's tensors)."""
    rt = device._rec.runtime
    wait = getattr(rt, "wait", None) or getattr(rt, "sync", None)  # a worker; a server
    if wait is not None:  # (a plain local device ran everything when it was flushed)
        wait()


def wait_all(devices: list[Any], probe: Callable[[], None] | None = None) -> Outcome:
    """Wait for each device (concurrently) to run what it was given: everything recorded is
    submitted first, from this thread (on the caller's thread: a recorder is not for several
    threads at once), all ranks' messages sent back to back with their Syncs
    (`collective.submit_all`), then one thread per device waits."""
    from .collective import submit_all

    out = Outcome()
    waits = _Waits(devices)
    waits.start(list(range(len(devices))), dict(enumerate(submit_all(devices))))
    probed = probe is None or len(devices) == 1
    lagging_since: float | None = None
    with waits.lock:
        while not waits.settled():
            waits.lock.wait(PROBE_AFTER / 4)
            late = waits.stragglers()
            if not late or probed:
                lagging_since = None
                continue
            lagging_since = lagging_since or time.monotonic()
            if time.monotonic() - lagging_since < PROBE_AFTER:
                continue
            probed = waits.probed = True
            waits.lock.release()
            try:  # recorded here: the threads of the answered ranks are done with them
                probe()  # type: ignore[misc]
            except ConnectionError as exc:  # a device whose connection is already gone
                waits.errors.setdefault(late[0], exc)
            finally:
                waits.lock.acquire()
            waits.start([r for r in range(len(devices)) if r not in late])
        out.errors = dict(waits.errors)
        out.completed = set(waits.completed)
    for r, err in out.errors.items():
        if _is_group_error(err):
            out.dead.add(int(err.rank))
        elif _is_lost(err):
            out.dead.add(r)
    return out


__all__ = ["PROBE_AFTER", "Outcome", "wait_all"]
