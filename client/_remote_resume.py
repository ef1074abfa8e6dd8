"""Client half of session resume: sequenced control frames and the resume handshake.

Every batch the link sends is numbered and kept until the server's ``ack`` covers it (bulk
transfers are kept by the link until the server acknowledged all their bytes); every server frame's number is remembered so a frame resent after a
reconnect is applied once. See ``burn_remote.protocol.sequencing`` for the frame format.
"""

from __future__ import annotations

import os
import struct
from collections import deque

from burn_remote.protocol import messages as m
from burn_remote.protocol.sequencing import HEADER, MAGIC, SESSION_EXPIRED, unwrap, wrap

_PREFIXED = struct.Struct(">I" + HEADER.format.lstrip(">"))
"""A transport frame's 4-byte length prefix followed by the sequencing header."""
STAMP_ROOM = _PREFIXED.size
"""Bytes ``ClientSequencer.stamp`` writes in front of a frame."""

RESUME_TIMEOUT = float(os.environ.get("BURN_REMOTE_RESUME_TIMEOUT", "30"))
"""Seconds the link keeps trying to reconnect after losing the server (the server's default
resume grace: after it, the session is gone anyway). A server whose host answers that
nothing listens any more is reported at once."""
ATTEMPT_TIMEOUT = 3.0
"""Seconds one reconnection attempt may take."""


class SessionExpired(Exception):
    """The server no longer holds our session: it was not resumed within its grace period."""


class ClientSequencer:
    """Numbers outgoing control frames, keeps them until acknowledged, drops duplicates."""

    def __init__(self) -> None:
        self.sent = 0
        self.received = 0
        self.unacked: deque[tuple[int, bytes | memoryview]] = deque()

    def wrap(self, frame: bytes) -> bytes:
        """``frame`` with the sequencing header (our next number, the last one we received), kept
        until the server acknowledges it so a resumed session can send it again."""
        self.sent += 1
        out = wrap(self.sent, self.received, frame)
        self.unacked.append((self.sent, out))
        return out

    def stamp(self, buffer: bytearray) -> memoryview:
        """Number a frame built with ``STAMP_ROOM`` bytes free in front of it: writes the
        transport's length prefix and the sequencing header there, so ``buffer`` goes to the
        transport as it is (``send_frame(..., prefixed=True)``), with no copy of the frame.
        Returns the sequenced frame (a view of ``buffer`` past the prefix), kept for resume."""
        self.sent += 1
        _PREFIXED.pack_into(buffer, 0, len(buffer) - 4, MAGIC, self.sent, self.received)
        out = memoryview(buffer)[4:]
        self.unacked.append((self.sent, out))
        return out

    def acknowledge(self, ack: int) -> None:
        """The server has everything up to ``ack``: forget those kept frames (they will not be sent
        again on resume)."""
        while self.unacked and self.unacked[0][0] <= ack:
            self.unacked.popleft()

    def accept(self, frame: bytes) -> bytes | None:
        """The inner frame to hand to the protocol, or None for a duplicate."""
        h = unwrap(frame)
        if h is None:
            return frame
        seq, ack, inner = h
        self.acknowledge(ack)
        if seq == 0:
            return inner
        if seq <= self.received:
            return None
        self.received = seq
        return inner

    def goodbye(self) -> bytes:
        """Tells the server we close on purpose: free the session now, do not park it."""
        return wrap(0, self.received, b"")

    def resume_frame(self, token: bytes) -> bytes:
        """The first frame on a new connection: a Hello carrying the session's resume ``token`` and
        the last sequence number we received (unnumbered itself), so the server replays what we
        missed and tells us what it has."""
        return wrap(0, self.received, m.encode(m.Hello(m.PROTOCOL_VERSION, token)))

    def resumed(self, reply: bytes | None) -> list[bytes | memoryview]:
        """Apply the server's answer to ``resume_frame``; the frames to send again, in order.

        Raises:
            SessionExpired: the server answered that the session is gone.
        """
        h = unwrap(reply or b"")
        if h is None:
            raise SessionExpired("the server closed the connection instead of resuming")
        _, ack, inner = h
        (msg, *_) = m.decode(inner)
        if isinstance(msg, m.Error):
            if msg.code == SESSION_EXPIRED:
                raise SessionExpired(msg.message)
            raise SessionExpired(f"resume refused: {msg.message}")
        self.acknowledge(ack)
        return [frame for _, frame in self.unacked]


__all__ = ["ATTEMPT_TIMEOUT", "RESUME_TIMEOUT", "ClientSequencer", "SessionExpired"]
