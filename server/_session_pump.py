"""One client session's I/O: its control stream and bulk streams feed the sans-I/O
``Session``, and what it produces goes out; engine work runs in worker threads
(``_limiter``). The daemon (``_daemon``) makes one pump per session."""

from __future__ import annotations

import logging
import os
from collections import deque
from contextlib import suppress
from typing import Any

import trio

from ..engine.preempt import checkpoints
from ..protocol import messages as m
from ..protocol.bulk import BulkSend, parse_header
from ..protocol.sequencing import unwrap
from ..protocol.transport import Connection, Endpoint, FrameStream, FrameTooLarge, TransportError
from ._fair import SESSION_WEIGHT, SLICE, HeldTurn, Ticket
from ._fetch import FETCH_TIMEOUT, DialRefused, fetch_from
from ._replies import Failure, Place, SendBulk, StartFetch
from ._resume import SequencedControl
from ._session import Session
from ._state import LimitExceeded

log = logging.getLogger("burn_remote.server")

BULK_WAIT = 60.0
"""Seconds an Upload waits for its transfer to make progress before it fails (the session
goes on)."""

MAX_HEADLESS_FAILURES = 16
"""Bulk streams of one connection that failed before their header named a transfer, kept
until an Upload waits for a transfer whose stream never opened (each such Upload takes one
and fails at once; older ones are dropped beyond this many)."""

INLINE_FRAMES = os.environ.get("BURN_REMOTE_INLINE_FRAMES", "1") != "0"
"""Answer cheap control frames on the receive loop (``SessionPump._inline``); 0 turns it
off (for A/B measurements)."""

_KICKED = object()
"""What ``_next_frame`` returns when the fast path left work for the pump."""
_WAKE_ONLY = object()
"""A stash entry that only wakes the pump (the connection failed under the fast path)."""

JOB_WORKERS = 64
"""Job worker threads (``Place.JOBS``): long polls wait there, apart from the engine
workers, so watchers never hold up engine work or the network loop."""

_JOB_LIMITER: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("job_limiter")


def _limiter(place: Place) -> trio.CapacityLimiter:
    """Engine work (and compiles) shares trio's default thread limit; job work has its own."""
    if place is Place.ENGINE or place is Place.COMPILE:
        return trio.to_thread.current_default_thread_limiter()
    try:
        return _JOB_LIMITER.get()
    except LookupError:
        limiter = trio.CapacityLimiter(JOB_WORKERS)
        _JOB_LIMITER.set(limiter)
        return limiter


class SessionPump:
    """Feeds one session from its control and bulk streams and sends what it produces."""

    def __init__(self, session: Session, ep: Endpoint, conn: Connection, control: Any) -> None:
        self.session, self.ep, self.conn, self.control = session, ep, conn, control
        self._arrived = trio.Event()
        self._progress = 0
        """Chunks received on any bulk stream (a long transfer that moves is not stalled)."""
        self._headless: deque[Failure] = deque(maxlen=MAX_HEADLESS_FAILURES)
        """Why bulk streams failed before their header (an oversized or undecodable first
        frame, a stream reset before it): which Upload each was for is unknown."""
        self._why = "session refused"
        """The reason the connection is closed with when the session must end."""
        self._idle = False
        """True while ``run`` waits for the next control frame with nothing else to do."""
        self._wake: trio.CancelScope | None = None
        self._stash: list[Any] = []
        """Outputs of the fast path left for this task to send, in order."""

    async def run(self, first: bytes | None) -> None:
        """Serve the connection; ``first`` is None for a resumed session, whose queued
        messages and unfinished transfers to the client go on at once."""
        stream = getattr(self.control, "stream", self.control)  # under the resume wrapper
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            nursery.start_soon(self._accept_bulk)
            for send in list(self.session.bulk_out.values()):
                nursery.start_soon(self._send_bulk, send)
            frame = first
            if INLINE_FRAMES and isinstance(stream, FrameStream):
                stream.on_frame = self._inline
            try:
                while True:
                    await self._process(frame)
                    if self.session.closed:
                        break
                    try:
                        frame = await self._next_frame()
                    except FrameTooLarge as exc:  # frame boundaries are lost: say so, then end
                        await self.control.send_frame(m.encode(m.Error(m.LIMIT, str(exc), -1, 0)))
                        self.session.closed = True
                        self._why = f"control frame too large: {exc}"
                        break
                    if frame is None:
                        break
            finally:
                if getattr(stream, "on_frame", None) == self._inline:
                    stream.on_frame = None
            nursery.cancel_scope.cancel()
        if self.session.closed:
            await self.conn.close(self._why)

    async def _next_frame(self) -> Any:
        """The next control frame (None at the end), or ``_KICKED`` when the receive loop's
        fast path (``_inline``) took frames and left work for this task: a message for a
        worker, replies that did not fit the send buffer, or the end of the session."""
        with trio.CancelScope() as scope:
            self._wake = scope
            self._idle = True
            try:
                return await self.control.receive_frame()
            finally:
                self._idle = False
                self._wake = None
        return _KICKED

    def _inline(self, frame: bytes) -> bool:
        """Answer a control frame on the endpoint's receive loop, with no task switch,
        while this pump waits for one (``FrameStream.on_frame``). The messages run on the
        loop as far as ``Session.step`` lets them there (the same rule as ``_process``:
        cheap work only); what is left, or replies the send buffer cannot take now, wake
        this pump. False leaves the frame to the pump (a control-only frame)."""
        if not self._idle or self._stash:
            return False
        session, control = self.session, self.control
        if session.closed or session.queue or not session.ready():
            return False  # not while idle; the pump sorts it out
        sequenced = type(control) is SequencedControl
        try:
            if sequenced:
                h = unwrap(frame)
                if h is None:
                    inner = frame
                elif h[0] == 0:  # control-only (goodbye): the pump's to end
                    return False
                else:
                    inner = control.accept_parts(*h)
                    if inner is None:  # a frame applied before (resent after a reconnect)
                        return True
            else:
                inner = frame
            now = self.ep.batch_time
            reply = session.answer_alone(inner, now)  # item()'s lone Read, answered at once
            if reply is not None:
                outs: list[Any] = [reply]
            else:
                session.feed_control(inner)
                outs = session.step(now, Place.LOOP)
            send = control.send_nowait if sequenced else control.send_frame_nowait
            for i, out in enumerate(outs):
                if isinstance(out, bytes):
                    if not send(out):
                        self._stash.extend(outs[i:])  # in order, by the pump
                        break
                elif isinstance(out, SendBulk):
                    self.nursery.start_soon(self._send_bulk, out.send)
                elif isinstance(out, StartFetch):
                    self.nursery.start_soon(self._fetch, out)
        except TransportError:
            self._stash.append(_WAKE_ONLY)  # the pump's next receive reports the loss
        except Exception:  # a bug: end this session, not the loop that serves everyone
            log.exception("session %d: inline processing failed", session.id)
            session.closed = True
            self._why = "server error"
        if self._stash or session.queue or session.closed:
            self._idle = False
            if self._wake is not None:
                self._wake.cancel()
        return True

    async def _process(self, frame: Any) -> None:
        session = self.session
        if self._stash:
            stash, self._stash = self._stash, []
            await self._emit([out for out in stash if out is not _WAKE_ONLY])
        if frame is not None and frame is not _KICKED:
            session.feed_control(frame)
        fair, turn = session.state.fair, None
        try:
            while True:
                place = session.next_place()
                now = trio.current_time()
                if place is Place.LOOP:
                    outs = session.step(now, place)
                elif place is Place.ENGINE and not session.groups:
                    # a fair turn (``_fair``); a group's graphs wait on their other ranks
                    if turn is None:
                        turn = fair.ask(session.peer_id, "session", SESSION_WEIGHT)
                    await fair.wait(turn)
                    outs, turn = await trio.to_thread.run_sync(
                        self._engine_turn, turn, now, limiter=_limiter(place)
                    )
                else:
                    if turn is not None:  # a compile or a job's long poll holds no turn
                        fair.cancel(turn)
                        turn = None
                    outs = await trio.to_thread.run_sync(
                        session.step, now, place, limiter=_limiter(place)
                    )
                await self._emit(outs)
                if session.closed or not session.queue:
                    return
                if session.ready():
                    continue  # stopped where the next message must run elsewhere
                if turn is not None:  # no holding a place in the queue while waiting
                    fair.cancel(turn)
                    turn = None
                await self._wait_ready()
        finally:
            if turn is not None:
                fair.cancel(turn)

    def _engine_turn(self, turn: Ticket, now: float) -> tuple[list[Any], Ticket | None]:
        """One fair turn on an engine worker: at most a SLICE of the session's messages,
        charged its time; the next turn is asked for at once while work is left."""
        session = self.session
        held = HeldTurn(session.state.fair, turn)
        try:
            with checkpoints(held.checkpoint):  # long graphs give way between steps
                outs = session.step(now, Place.ENGINE, SLICE)
        except BaseException:
            held.end()
            raise
        more = bool(session.queue) and not session.closed and session.ready()
        return outs, held.end(more)

    async def _emit(self, outs: list[Any]) -> None:
        for out in outs:
            if isinstance(out, bytes):
                await self.control.send_frame(out)
            elif isinstance(out, SendBulk):
                self.nursery.start_soon(self._send_bulk, out.send)
            elif isinstance(out, StartFetch):
                self.nursery.start_soon(self._fetch, out)

    async def _wait_ready(self) -> None:
        """Wait for what the session waits for; a transfer that makes no progress for
        BULK_WAIT is given up (its Upload fails, nothing of it is stored)."""
        session = self.session
        seen = self._progress
        while not session.ready():
            if self._blame_headless():
                continue
            with trio.move_on_after(BULK_WAIT) as scope:
                await self._arrived.wait()
                self._arrived = trio.Event()
            if scope.cancelled_caught:
                if self._progress != seen:
                    seen = self._progress
                    continue
                if session.waiting and session.waiting[0] == "bulk":
                    session.feed_bulk(session.waiting[1], None)  # never came: the Upload fails
                return

    def _blame_headless(self) -> bool:
        """Fail the transfer the session waits for with a headless stream's failure, when
        that transfer's stream never opened: the client's stream for it is the one that
        failed (only its own Uploads can be blamed, and one failure fails one Upload)."""
        session = self.session
        if not self._headless or session.waiting is None or session.waiting[0] != "bulk":
            return False
        bulk_id = session.waiting[1]
        if bulk_id in session.bulk_partial or bulk_id in session.bulk_in:
            return False
        failure = self._headless.popleft()
        message = f"bulk {bulk_id}: a bulk stream failed before its header: {failure}"
        session.refuse_bulk(bulk_id, failure.code, message)
        return True

    async def _send_bulk(self, send: BulkSend) -> None:
        """One transfer to the client on a stream of its own, from the last offset the
        client acknowledged; a lost link leaves it in ``bulk_out`` for the resumed one."""
        failed = False
        try:
            s = await self.conn.open_stream()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read_acks, s, send, nursery.cancel_scope)
                await s.send_frame(send.header())
                for chunk in send.chunks():
                    if send.done:
                        break
                    await s.send_frame(chunk)
        except* m.DecodeError as group:
            log.warning("session %d: bad BulkAck: %s", self.session.id, group.exceptions[0])
            failed = True
        except* TransportError as group:
            # The link died: the resumed connection continues the transfer.
            log.info("session %d: bulk %d paused: %s", self.session.id, send.bulk_id,
                     group.exceptions[0])  # fmt: skip
            failed = True
        if failed:
            return
        self.session.bulk_sent(send.bulk_id)
        with suppress(TransportError):
            await s.close()
            await s.receive_frame()  # the client ends its side after ours

    async def _read_acks(self, s: FrameStream, send: BulkSend, scope: trio.CancelScope) -> None:
        while True:
            frame = await s.receive_frame()
            if frame is None:
                raise TransportError(f"bulk {send.bulk_id}: the client ended the stream")
            if send.on_ack(frame):
                scope.cancel()
                return

    async def _accept_bulk(self) -> None:
        while True:
            s = await self.conn.accept_stream()
            self.nursery.start_soon(self._receive_bulk, s)

    async def _receive_bulk(self, s: FrameStream) -> None:
        """One transfer from the client, written into its buffer chunk by chunk and
        acknowledged as it goes. A stream cut short by a lost connection leaves it partial
        for a resumed one; a stream that fails while the connection lives (an oversized
        frame, answered STOP_SENDING; reset or ended early by the client) fails its Upload
        at once, as nothing will resume it, so the session's later messages do not wait
        behind it (``_wait_ready``'s BULK_WAIT)."""
        session = self.session
        header = None
        try:
            header = parse_header(await s.receive_frame())
            rx = session.open_bulk(header)
            if rx is None:  # already whole: its final BulkAck was lost with a link
                await s.send_frame(m.encode(m.BulkAck(header.bulk_id, header.size)))
            else:
                ack = rx.start(header)
                if ack is not None:
                    await s.send_frame(ack)
                while not rx.done:
                    chunk = await s.receive_frame()
                    if chunk is None:
                        if self.conn.is_closed:
                            return  # a lost link: resumed later, or given up
                        raise TransportError(
                            f"the client ended the stream after {rx.received} of {rx.size} bytes"
                        )
                    ack = rx.feed(chunk)
                    self._progress += 1
                    if ack is not None:
                        await s.send_frame(ack)
                if header.bulk_id in session.bulk_partial:
                    session.feed_bulk(header.bulk_id, rx.buffer)
                    self._arrived.set()
        except TransportError as exc:
            if self.conn.is_closed:
                return  # the connection died; the partial transfer waits for a resume
            s.stop_reading()
            code = m.LIMIT if isinstance(exc, FrameTooLarge) else m.MALFORMED
            name = f"bulk {header.bulk_id}" if header is not None else "a bulk stream"
            self._bulk_failed(header, Failure(code, f"{name} failed: {exc}"))
            return
        except (m.DecodeError, LimitExceeded) as exc:
            code = m.LIMIT if isinstance(exc, LimitExceeded) else m.MALFORMED
            s.stop_reading()
            self._bulk_failed(header, Failure(code, str(exc)))
            return
        # Both directions finished (ours now, the client's next): QUIC and the connection
        # free the stream's state at both ends.
        with suppress(TransportError):
            await s.close()
            while await s.receive_frame() is not None:
                pass

    def _bulk_failed(self, header: m.Bulk | None, failure: Failure) -> None:
        """A bulk stream failed on a live connection: its Upload fails at once (before its
        header, the Upload waiting for a stream that never opened: ``_blame_headless``)."""
        if header is not None:
            self.session.refuse_bulk(header.bulk_id, failure.code, str(failure))
        else:
            self._headless.append(failure)
        self._arrived.set()

    async def _fetch(self, out: StartFetch) -> None:
        result: Any
        try:
            with trio.fail_after(FETCH_TIMEOUT):
                result = await fetch_from(self.ep, self.session, out)
        except DialRefused as exc:
            result = Failure(m.LIMIT, str(exc))
        except (TransportError, ValueError, OSError, trio.TooSlowError, LimitExceeded) as exc:
            result = f"{type(exc).__name__}: {exc}"
        self.session.feed_fetched(out.tensor_id, result)
        self._arrived.set()
