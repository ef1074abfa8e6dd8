"""Collectives on the executing side: the ``all_reduce`` kernel and the groups it runs in.

The kernel is the same function in every backend's table. It finds the group named by its
``group`` attribute in the *scope* the runtime set for the graph being run (a thread-local:
a server session's groups, a local replica's groups), so a graph can only reach the groups
of whoever runs it. How the bytes move is the group member's business: ``local.py`` (local
replicas, in memory), ``ring.py`` (the schedule of the ring over server links) and
``nccl.py`` (CuPy's NCCL between GPU servers).
"""

from __future__ import annotations

from typing import Any

from ._errors import GroupFailure
from ._scope import Member, Scope, current, scope


def all_reduce_kernel(x: Any, group: int, op: str) -> Any:
    """The ``all_reduce`` kernel of every backend: hand ``x`` to this runtime's member of
    ``group`` and return what it gives back (a new array; ``x`` is never written)."""
    sc = current()
    member = None if sc is None else sc.groups.get(group)
    if sc is None or member is None:
        raise GroupFailure(
            group, -1, "", "this device is not a member of the group (never set up, or closed)"
        )
    return member.all_reduce(x, op, sc.backend)


__all__ = ["GroupFailure", "Member", "Scope", "all_reduce_kernel", "current", "scope"]
