"""Session resume: sequenced control frames, a replay buffer, and parked sessions.

A client that speaks resume wraps every control frame as ``0xC1, seq u64, ack u64, inner``
(0xC1 is the one byte msgpack never uses, so a wrapped frame cannot be mistaken for a plain
one). ``seq`` numbers the sender's frames from 1 (0: a control-only frame that is not
counted); ``ack`` is the last ``seq`` received from the other side. The server applies each
client frame once (it remembers the last applied ``seq`` and skips anything not newer) and
keeps its own frames until acknowledged, so after a reconnect it resends exactly what the
client missed. When a connection dies without the client closing, the session is *parked*
for a grace period; a new connection of the same peer presenting the session's token in a
``Hello`` (with ``seq`` 0) takes it over. After the grace period it is freed, and a late
resume gets ``Error(SESSION_EXPIRED)``.

The wrapper sits around the control stream, so the session pump does not know about it.
Bulk streams are not sequenced: a transfer cut mid-way continues, once the session is
resumed, on a new stream from its last acknowledged offset (``protocol/bulk.py``).
"""

from __future__ import annotations

import hmac
import logging
from collections import deque
from typing import TYPE_CHECKING, Any

import trio

from ..protocol import messages as m
from ..protocol.sequencing import SESSION_EXPIRED, unwrap, wrap
from ..protocol.transport import Connection, Endpoint, FrameStream, TransportError
from ._session import Session
from ._state import ServerState

if TYPE_CHECKING:
    from ._session_pump import SessionPump

log = logging.getLogger("burn_remote.server")

REPLAY_MAX_BYTES = 64 * 1024 * 1024
"""Unacknowledged reply bytes kept per session for resending after a reconnect."""
DEFAULT_GRACE = 30.0


class SequencedControl:
    """The server's control stream, sequenced: looks like a FrameStream to the pump."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.applied = 0
        self.sent = 0
        self.replay: deque[tuple[int, bytes]] = deque()
        self.replay_bytes = 0
        self.dropped_upto = 0
        """Highest seq evicted from the replay buffer unacknowledged (resume then fails)."""
        self.broken: TransportError | None = None
        self.goodbye = False
        """The client said it is closing (an empty control-only frame): do not park."""

    def accept(self, frame: bytes) -> bytes | None:
        """The inner frame to apply, or None for a duplicate or a control-only frame."""
        h = unwrap(frame)
        if h is None:
            return frame
        return self.accept_parts(*h)

    def accept_parts(self, seq: int, ack: int, inner: bytes) -> bytes | None:
        """``accept`` of a frame already unwrapped (the receive loop's fast path reads the
        header once)."""
        if self.replay:
            self.acknowledge(ack)
        if seq == 0 and not inner:
            self.goodbye = True
        if seq == 0 or seq <= self.applied:
            return None
        self.applied = seq
        return inner

    def acknowledge(self, ack: int) -> None:
        while self.replay and self.replay[0][0] <= ack:
            self.replay_bytes -= len(self.replay.popleft()[1])

    async def receive_frame(self) -> bytes | None:
        while True:
            if self.broken is not None:
                raise self.broken
            frame = await self.stream.receive_frame()
            if frame is None:
                return None
            inner = self.accept(frame)
            if inner is not None:
                return inner
            if self.goodbye:
                return None

    async def send_frame(self, inner: bytes) -> None:
        """Number, keep and send; a dead link is reported at the next receive, so every
        reply of a step is kept for the resumed connection."""
        self.sent += 1
        frame = wrap(self.sent, self.applied, inner)
        self._keep(self.sent, frame)
        if self.broken is None:
            try:
                await self.stream.send_frame(frame)
            except TransportError as exc:
                self.broken = exc

    def send_nowait(self, inner: bytes) -> bool:
        """``send_frame`` without waiting, for the receive loop's fast path: False (nothing
        numbered or kept) when the stream cannot take the frame now."""
        frame = wrap(self.sent + 1, self.applied, inner)
        if self.broken is None:
            try:
                if not self.stream.send_frame_nowait(frame):
                    return False
            except TransportError as exc:
                self.broken = exc
        self.sent += 1
        self._keep(self.sent, frame)
        return True

    async def close(self) -> None:
        await self.stream.close()

    def _keep(self, seq: int, frame: bytes) -> None:
        self.replay.append((seq, frame))
        self.replay_bytes += len(frame)
        while self.replay_bytes > REPLAY_MAX_BYTES and len(self.replay) > 1:
            old_seq, old = self.replay.popleft()
            self.replay_bytes -= len(old)
            self.dropped_upto = old_seq

    def resend_after(self, ack: int) -> list[bytes] | None:
        """Frames the client has not seen, or None when some were evicted."""
        if ack < self.dropped_upto:
            return None
        self.acknowledge(ack)
        return [f for _, f in self.replay]


class Parking:
    """Sessions whose connection died, kept for ``grace`` seconds for their client."""

    def __init__(self, grace: float = DEFAULT_GRACE) -> None:
        self.grace = grace
        self._parked: dict[bytes, tuple[Any, SequencedControl, str, float]] = {}
        self._live: dict[bytes, Any] = {}

    def attach(self, session: Any, conn: Any) -> None:
        self._live[session] = conn

    def detach(self, session: Any) -> None:
        self._live.pop(session, None)

    def park(self, token: bytes, session: Any, control: SequencedControl, peer: str) -> None:
        self._live.pop(session, None)
        if self.grace <= 0:
            session.close()
            return
        self._parked[token] = (session, control, peer, trio.current_time() + self.grace)
        log.info(
            "session %d parked for %.0f s",
            session.id,
            self.grace,
            extra={"event": "session_parked", "session": session.id, "peer": peer},
        )

    async def claim(self, token: bytes, peer: str) -> tuple[Any, SequencedControl] | None:
        """Take over a parked session of ``peer``; waits briefly for a connection that died
        but is not yet noticed as dead on this side. Only a session of the same peer with
        the same token is touched: a wrong token (or another peer's) changes nothing."""
        live = [(s, c) for s, c in self._live.items() if _owns(s, token, peer)]
        for session, old in live:
            await old.close("session resumed on a new connection", flush_timeout=0.5)
            with trio.move_on_after(10):
                while session in self._live:
                    await trio.sleep(0.05)
        self.sweep()
        entry = self._parked.get(token)
        if entry is None or not _owns(entry[0], token, peer):
            return None
        del self._parked[token]
        return entry[0], entry[1]

    def sweep(self) -> None:
        now = trio.current_time()
        for token, (session, _, _, deadline) in list(self._parked.items()):
            if deadline < now:
                del self._parked[token]
                session.close()
                log.info(
                    "session %d expired after its grace period",
                    session.id,
                    extra={"event": "session_expired", "session": session.id},
                )

    async def sweep_loop(self) -> None:
        while True:
            await trio.sleep(min(1.0, max(0.1, self.grace / 4)))
            self.sweep()


def _token(session: Any) -> bytes:
    """The resume token a session's Welcome carried."""
    return session.resume_token


def _owns(session: Any, token: bytes, peer: str) -> bool:
    """Whether ``peer`` presenting ``token`` may take ``session`` over (constant time)."""
    return session.peer_id == peer and hmac.compare_digest(_token(session), token)


def refuse_legacy(first: bytes) -> bytes:
    """The answer to the first control frame of a client that offered only the transport
    before this one (ALPN ``burn-remote/1``, protocol version 3, which proved keys inside
    TLS): the ``Error(VERSION)`` such a client reads as final, sequenced as its frame was
    (a new session's reply is frame 1, a resume's a control-only frame)."""
    h = unwrap(first)
    inner = first if h is None else h[2]
    try:
        msgs = m.decode(inner)
        theirs = f"protocol version {msgs[0].version}" if isinstance(msgs[0], m.Hello) else None
    except (m.DecodeError, IndexError):
        theirs = None
    error = m.Error(
        m.VERSION,
        f"the client speaks {theirs or 'an older protocol version'}, this server version "
        f"{m.PROTOCOL_VERSION}, which proves keys differently (upgrade the older side)",
        -1,
        0,
    )
    if h is None:
        return m.encode(error)
    seq = h[0]
    return wrap(1 if seq else 0, seq, m.encode(error))


def _resume_token(msgs: list[Any]) -> bytes | None:
    if len(msgs) == 1 and isinstance(msgs[0], m.Hello) and msgs[0].resume_token:
        return msgs[0].resume_token
    return None


async def run_session(
    state: ServerState,
    ep: Endpoint,
    conn: Connection,
    control: FrameStream,
    first: bytes,
    pump: type[SessionPump],
    parking: Parking,
) -> None:
    """Run a client session on ``conn``: a new one, a resumed one, or (plain frames) a
    session without resume."""
    peer = str(conn.peer_id)
    h = unwrap(first)
    if h is None:  # a client that does not sequence: no resume
        session = Session(state, peer)
        try:
            await pump(session, ep, conn, control).run(first)
        finally:
            session.close()
        return
    seq, ack, inner = h
    try:
        token = _resume_token(m.decode(inner)) if seq == 0 else None
    except m.DecodeError:
        token = None
    if seq == 0 and token is None:  # neither a resume nor a session's first frame (seq 1)
        why = (
            "a first control frame with seq 0 must hold one Hello with a resume token "
            "(section 10); a new session starts with seq 1"
        )
        await control.send_frame(wrap(0, 0, m.encode(m.Error(m.MALFORMED, why, -1, 0))))
        await conn.close("malformed first frame", flush_timeout=2.0)
        return
    if token is not None:
        claimed = await parking.claim(token, peer)
        frames = claimed[1].resend_after(ack) if claimed is not None else None
        if claimed is None or frames is None:
            if claimed is not None:
                claimed[0].close()
            why = "session expired: not resumed within the grace period (or unknown token)"
            await control.send_frame(wrap(0, 0, m.encode(m.Error(SESSION_EXPIRED, why, -1, 0))))
            await conn.close("session expired", flush_timeout=2.0)
            return
        session, sc = claimed
        sc.stream, sc.broken = control, None
        welcome = state.welcome(session.id, token)
        await control.send_frame(wrap(0, sc.applied, m.encode(welcome)))
        for frame in frames:
            await control.send_frame(frame)
        log.info(
            "session %d resumed (%d frames resent)",
            session.id,
            len(frames),
            extra={"event": "session_resumed", "session": session.id, "peer": peer},
        )
        start: bytes | None = None
    else:
        session = Session(state, peer)
        sc = SequencedControl(control)
        start = sc.accept(first)
        if start is None:
            return
    parking.attach(session, conn)
    try:
        await pump(session, ep, conn, sc).run(start)
    finally:
        if sc.goodbye or session.closed or not session.greeted:
            parking.detach(session)
            session.close()
        else:
            parking.park(_token(session), session, sc, peer)


__all__ = [
    "SESSION_EXPIRED",
    "Parking",
    "SequencedControl",
    "refuse_legacy",
    "run_session",
    "unwrap",
    "wrap",
]
