"""What a message handler may give back, and where it runs: the leaf that the handler
modules (``_handlers``, ``jobs/_wire``) and the session import, so none imports another.

A handler is ``run(session, msg, now) -> Reply``: it reads and changes the session's tensor
store through the session's helpers and returns what to send; it never appends to the
session's outgoing lists. It raises :class:`Failure` for an error the client sees.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..protocol import messages as m
from ..protocol.bulk import BulkSend


class Place(enum.Enum):
    """Where a handler runs. The network loop serves every connection: a handler placed
    there must never wait (no lock held for long, no I/O, no sleep, no long poll)."""

    LOOP = "loop"
    """On the network loop, at once: reads, syncs, drops, small timed plans."""
    ENGINE = "engine"
    """On an engine worker thread, in a fair turn: running plans, uploads to the device."""
    COMPILE = "compile"
    """On an engine worker thread outside the engine's fair turns: decoding, validating and
    compiling a registered graph. That is host Python, no BLAS, so it shares the interpreter
    with the steps of others instead of holding the engine's one CPU turn (a maximal graph's
    registration takes seconds, and no step of a compile can give way)."""
    JOBS = "jobs"
    """On a job worker thread (its own thread limit): the job store, long polls, artifact
    files. A session waiting here holds no engine worker and never the loop."""


@dataclass(frozen=True, slots=True)
class SendBulk:
    """Action: send a transfer on a bulk stream (``Session.bulk_out`` keeps it until the
    client acknowledged all of it, so a resumed connection continues it)."""

    send: BulkSend


@dataclass(frozen=True, slots=True)
class StartFetch:
    """Action: fetch a tensor from another server, then call ``feed_fetched``."""

    tensor_id: int
    source_peer: str
    """Peer id only: the server resolves the address itself (``_peers.dial_peer``)."""
    token: bytes


@dataclass(frozen=True, slots=True)
class Wait:
    """The handler cannot go on before a bulk payload (``kind`` "bulk") or a fetched tensor
    ("fetch") arrives: the session keeps the message at the head of its queue and runs it
    again then. ``action`` (a StartFetch) is sent once, when the wait begins."""

    kind: str
    key: int
    action: StartFetch | None = None


Reply = Sequence["m.Message | SendBulk"] | Wait | None
"""What a handler returns: messages to send (in order) and bulk sends, or a Wait."""


class Failure(Exception):
    """An error answered to the client as ``Error(code, message, node)``."""

    def __init__(self, code: int, message: str, node: int = -1, consequence: bool = False) -> None:
        super().__init__(message)
        self.code, self.node = code, node
        self.consequence = consequence
        """It follows from an error already answered (a read of what a failed step would
        have made): answered, but not counted again in ``errors_total``."""


@dataclass(frozen=True, slots=True)
class Handler:
    """One entry of the server's handler table: what runs a client message, and where."""

    run: Callable[[Any, Any, float], Reply]
    """``run(session, msg, now)``."""
    place: Place
    """Where it runs (see :class:`Place`)."""
    inline: Callable[[Any, Any], float | None] | None = None
    """For an ENGINE handler whose cost can be known before it runs: ``inline(session, msg)``
    gives the seconds it should take (None: unknown), and it runs on the loop when that fits
    the loop's budget (``_session.INLINE_BUDGET``). A thread handoff costs more than a small
    step (two wakeups and a GIL ping-pong)."""


__all__ = ["Failure", "Handler", "Place", "Reply", "SendBulk", "StartFetch", "Wait"]
