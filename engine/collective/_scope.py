"""Which groups a graph may use: a thread-local the runtime sets around each execution.

A server runs many sessions' graphs on shared worker threads and a local replica runs its
own on one; the kernel reads the scope of the thread it runs on, so one session's graph can
never name (and feed data into) another session's group.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol


class Member(Protocol):
    """One rank's end of a group."""

    def all_reduce(self, x: Any, op: str, backend: Any) -> Any: ...


@dataclass(frozen=True, slots=True)
class Scope:
    groups: Mapping[int, Member]
    """Group id -> this runtime's member (read when the kernel runs: groups set up later
    are seen)."""
    backend: Any
    """The backend whose arrays the kernel gets (host copies go through it)."""


_local = threading.local()


def current() -> Scope | None:
    return getattr(_local, "scope", None)


@contextmanager
def scope(groups: Mapping[int, Member], backend: Any) -> Iterator[None]:
    """Run a graph with ``groups`` reachable from its collective kernels."""
    previous = getattr(_local, "scope", None)
    _local.scope = Scope(groups, backend)
    try:
        yield
    finally:
        _local.scope = previous
