"""Waiting for every replica at once, and telling the dead from the survivors.

A step on a group either succeeds on every replica or fails on every survivor with the
collective's GroupError naming the culprit; the culprit itself may not answer at all (a
killed server answers nothing until the connection's idle timeout). So the replicas are
waited for concurrently, and the wait ends as soon as every rank is either done or named dead
by a survivor's GroupError: a dead server never makes the user wait for its timeout.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

POLL_SECONDS = 0.05
"""How often the waiting thread looks whether the outstanding ranks are all named dead."""


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
    done: dict[int, bool] = {}
    lock = threading.Condition()

    def wait(rank: int, dev: Any) -> None:
        try:
            dev.sync()
        except BaseException as exc:  # reported to the caller, which raises
            with lock:
                out.errors[rank] = exc
        finally:
            with lock:
                done[rank] = True
                lock.notify_all()

    if len(devices) == 1:
        wait(0, devices[0])
    else:
        for r, d in enumerate(devices):
            threading.Thread(target=wait, args=(r, d), name=f"dp-wait-{r}", daemon=True).start()

    def settled() -> bool:
        named = {e.rank for e in out.errors.values() if _is_group_error(e)}
        return all(done.get(r) or r in named for r in range(len(devices)))

    with lock:
        while not settled():
            lock.wait(POLL_SECONDS)
        for r, exc in out.errors.items():
            if _is_group_error(exc):
                out.dead.add(int(exc.rank))
            elif _is_lost(exc):
                out.dead.add(r)
    return out


__all__ = ["Outcome", "wait_all"]
