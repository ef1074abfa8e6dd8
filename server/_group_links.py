"""The pipes and helpers of a group member's links to its ring neighbours: the QUIC fallback
data plane's two ends (ring data as frames on the QUIC link's second stream, moved by the
server's loop), the answer to a GroupLink and its hint for an older server, and the address
and log helpers of the TCP data plane."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import trio

from ..protocol import messages as m
from ..protocol.transport import FrameStream, TransportError
from . import _ring_data as rd

if TYPE_CHECKING:
    from ._groups import GroupMember

SETUP_TIMEOUT = 30.0
"""Seconds GroupStart waits for both ring links to come up (and an all-reduce for the
group to be linked)."""
ABORT_GRACE = 1.0
"""Seconds a failed member gives its aborts to leave before it closes its links."""

CANCELLED = object()
"""What ``GroupMember.on_loop`` gets when the group failed while it waited."""
LATE = object()
"""What ``GroupMember.on_loop`` gets when its timeout passed."""


class QuicOut:
    """The fallback plane, sending: this rank's ring data as frames on the QUIC link's
    second stream (the loop's transport moves them; each piece is copied once)."""

    plane = "quic"

    def __init__(self, member: GroupMember, stream: FrameStream) -> None:
        self.member, self.stream = member, stream

    def send_header(self, frame: bytes) -> None:
        self.member.on_loop(self.stream.send_frame, frame)

    def send_piece(self, piece: memoryview) -> None:
        self.member.on_loop(self.stream.send_frame, bytes(piece))
        self.member._moved["succ"] = time.monotonic()  # noqa: SLF001


class QuicIn:
    """The fallback plane, receiving: the predecessor's second QUIC stream."""

    plane = "quic"

    def __init__(self, member: GroupMember) -> None:
        self.member = member
        self.stream: FrameStream | None = None

    def recv_header(self, timeout: float) -> bytes | None:
        member = self.member
        if self.stream is None:
            conn = member.pred_conn
            if conn is None:
                raise rd.LinkBroken("has no link")
            self.stream = member.on_loop(conn.accept_stream, timeout=timeout)
            if self.stream is LATE:
                self.stream = None
                return None
        frame = member.on_loop(self.stream.receive_frame, timeout=timeout)
        if frame is LATE:
            return None
        if frame is None:
            raise rd.LinkBroken("closed its link")
        return frame

    def recv_piece_into(self, dest: memoryview) -> None:
        assert self.stream is not None
        frame = self.member.on_loop(self.stream.receive_frame)
        if frame is None or len(frame) != len(dest):
            raise rd.LinkBroken("sent a malformed piece")
        dest[:] = frame
        self.member._moved["pred"] = time.monotonic()  # noqa: SLF001


def records(end: Any) -> str:
    """How a TCP data link's records travel, for the log."""
    if not isinstance(end, rd.DataOut | rd.DataIn):
        return ""
    if end.sealed:
        return " (AES-256-GCM)"
    if end.shared:
        return " (same host: authenticated, through shared memory)"
    return " (same host: authenticated, not encrypted)"


def ring_target(address: str) -> tuple[str, int]:
    """GroupLink.ring_address as (host, port); host "" for ``:PORT`` (the successor's host,
    wherever this server reaches it)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("expected HOST:PORT or :PORT")
    return host.strip("[]"), int(port)


async def send_quietly(ctl: FrameStream, frame: bytes) -> None:
    with trio.move_on_after(ABORT_GRACE):
        try:
            await ctl.send_frame(frame)
        except TransportError:
            pass


def link_answer(frame: bytes) -> m.Message:
    """The successor's answer to a GroupLink: its GroupLink, or its Error. Raises
    VersionMismatch (naming both versions) for a GroupLink of another protocol version."""
    if m.is_group_link(frame):
        return m.read_group_link(frame)
    (reply,) = m.decode(frame)
    return reply


def older_hint(reply: m.Error) -> str:
    """A hint for a refusal from a server older than version 3: it could not read this
    server's GroupLink (it knows no version field there), so it cannot name its version."""
    if reply.code == m.VERSION or "GroupLink" not in reply.message:
        return ""
    return (
        f" (it could not read this server's GroupLink of protocol version "
        f"{m.PROTOCOL_VERSION}: it runs an older version)"
    )


__all__ = [
    "ABORT_GRACE",
    "CANCELLED",
    "LATE",
    "QuicIn",
    "QuicOut",
    "link_answer",
    "older_hint",
    "records",
    "ring_target",
    "send_quietly",
]
