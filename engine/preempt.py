"""Where a long engine run may give way: the executor calls its thread's *checkpoint* after
each plan step.

A server's engine turns are fair only between the points where one turn can end. Without
these, a turn ended at a message boundary, so one peer's long graph (a training step of
seconds, a job's whole plan) held the engine until it finished while a peer with one small
step waited. A server installs a checkpoint for the duration of each engine turn
(``server/_fair.HeldTurn``); it returns at once unless someone with less engine time waits,
and then blocks until the turn comes back. Nothing is cut inside a kernel: a kernel's
result must not depend on load, and cutting a product changes its last bits (OpenBLAS's
blocking follows the shape), so one step is the unit.

With no checkpoint installed (a local device) a run pays one attribute read. Imports only
the standard library.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

Checkpoint = Callable[[], None]

_local = threading.local()


def current() -> Checkpoint | None:
    """This thread's checkpoint, read once per run by the executor; None when none is set."""
    return getattr(_local, "check", None)


@contextmanager
def checkpoints(check: Checkpoint) -> Iterator[None]:
    """Runs on this thread call ``check`` between their steps while inside."""
    previous = getattr(_local, "check", None)
    _local.check = check
    try:
        yield
    finally:
        _local.check = previous


__all__ = ["Checkpoint", "checkpoints", "current"]
