"""Waiting for every replica at once, and telling the dead from the survivors.

A step on a group either succeeds on every replica or fails on every survivor with the
collective's GroupError naming the culprit; the culprit itself may not answer at all (a
killed server answers nothing until the connection gives up). So the replicas are waited for
concurrently, and the wait ends as soon as every rank is either done or named dead by a
survivor's GroupError: a dead server never makes the user wait for its connection timeout.
A server that dies while the group is idle is noticed by its neighbours' link heartbeats, and
their sessions report it at their next sync; so while some rank has not answered, the ranks
that did are asked again every `RECHECK_SECONDS`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

RECHECK_SECONDS = 1.0
"""How often a rank that answered is asked again while another rank has not answered."""


@dataclass
class Outcome:
    """What waiting for the replicas found."""

    errors: dict[int, BaseException] = field(default_factory=dict)
    """rank -> the error its own device raised (GroupError on survivors; a connection error
    on a dead rank's own device, when it answered at all)."""
    dead: set[int] = field(default_factory=set)
    """Ranks named as the culprit by a GroupError, or whose own connection failed for good.
    Other errors (an op that failed the same way on every replica) kill no rank."""

    @property
    def ok(self) -> bool:
        return not self.errors and not self.dead


def _is_group_error(exc: BaseException) -> bool:
    from . import collective

    return isinstance(exc, collective.GroupError)


def _is_lost(exc: BaseException) -> bool:
    """The device's own connection failed for good (its server died or was cut off)."""
    return isinstance(exc, ConnectionError | TimeoutError)


def wait_all(devices: list[Any]) -> Outcome:
    """Wait for each device (concurrently) to run what it was given (`sync` flushes it)."""
    out = Outcome()
    if len(devices) == 1:
        try:
            devices[0].sync()
        except BaseException as exc:  # reported to the caller, which raises
            out.errors[0] = exc
            if _is_lost(exc):
                out.dead.add(0)
        return out
    done: set[int] = set()
    running: set[int] = set(range(len(devices)))
    lock = threading.Condition()

    def named() -> set[int]:
        return {int(e.rank) for e in out.errors.values() if _is_group_error(e)}

    def settled() -> bool:
        dead = named()
        return all(r in done or r in dead for r in range(len(devices)))

    def finished() -> bool:
        """Settled, and no thread but a dead rank's still uses its device (the caller goes
        on recording on the others)."""
        return settled() and running <= named()

    def wait(rank: int, dev: Any) -> None:
        try:
            poll(rank, dev)
        finally:
            with lock:
                running.discard(rank)
                lock.notify_all()

    def poll(rank: int, dev: Any) -> None:
        while True:
            try:
                dev.sync()
            except BaseException as exc:  # reported to the caller, which raises
                with lock:
                    out.errors[rank] = exc
                    done.add(rank)
                    lock.notify_all()
                return
            with lock:
                done.add(rank)
                lock.notify_all()
                if settled() or lock.wait_for(settled, RECHECK_SECONDS):
                    return

    for r, d in enumerate(devices):
        threading.Thread(target=wait, args=(r, d), name=f"dp-wait-{r}", daemon=True).start()
    with lock:
        lock.wait_for(finished)
        for r, exc in out.errors.items():
            if _is_group_error(exc):
                out.dead.add(int(exc.rank))
            elif _is_lost(exc):
                out.dead.add(r)
    return out


__all__ = ["Outcome", "wait_all"]
