"""The QUIC glue of the server: one endpoint, one task group per connection, sessions driven
through their sans-I/O interface with engine work in worker threads.

A connection's first stream is its control stream. Its first frame says what the connection
is: ``Hello`` starts a client session; a lone ``Fetch`` is another server redeeming a
capability (server-to-server move), answered with ``Data`` and the bytes on that stream.
Every later stream a client opens is a bulk stream: one transfer (``protocol/bulk.py``).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import numpy as np
import trio

from ..protocol import messages as m
from ..protocol.addressing import format_host_port
from ..protocol.bulk import BulkReceive, BulkSend, parse_header
from ..protocol.transport import (
    AuthorizedPeers,
    Connection,
    Endpoint,
    EndpointConfig,
    FrameStream,
    FrameTooLarge,
    Identity,
    TransportError,
)
from ._group_service import is_group_link
from ._peers import dial_peer
from ._replies import Failure, Place, SendBulk, StartFetch
from ._resume import Parking, SequencedControl, refuse_legacy, run_session, unwrap
from ._session import Session
from ._state import LimitExceeded, ServerState

log = logging.getLogger("burn_remote.server")

BULK_WAIT = 60.0
"""Seconds an Upload waits for its transfer to make progress before it fails (the session
goes on)."""

SWITCH_INTERVAL = 0.0005
"""Seconds a Python thread may keep the interpreter lock while another waits for it
(CPython's default is 0.005). The network loop serves every session from one thread, and
each turn of it waits for the lock: behind a worker validating and compiling a large graph
(pure Python for seconds) that wait was up to 5 ms a turn, several times a round trip."""

GC_THRESHOLDS = (10_000, 10, 10)
"""The cyclic garbage collector's thresholds (CPython's first one is 700). Compiling a large
graph allocates hundreds of thousands of objects that live on; with the default, every few
thousand of them started a collection, dozens of them full ones that walk the whole heap
while every thread waits. ``bench/graph_gc.py`` (three 100 000-node graphs, 2 shared
cores): 36 full collections taking 7.7 s, a 1 ms sleep on another thread late by 5.8 ms
(median) and 281 ms (p99); with these 4 taking 1.1 s, late by 0.8 and 23 ms."""

MAX_HEADLESS_FAILURES = 16
"""Bulk streams of one connection that failed before their header named a transfer, kept
until an Upload waits for a transfer whose stream never opened (each such Upload takes one
and fails at once; older ones are dropped beyond this many)."""

FETCH_TIMEOUT = 120.0
"""Seconds a server-to-server fetch may take before the destination reports CAPABILITY."""


@dataclass
class ServeOptions:
    """Everything ``burn-remote serve`` needs; the CLI only fills this in."""

    state: ServerState
    identity: Identity
    bind: tuple[str, int] = ("127.0.0.1", 0)
    authorized_peers: Any = None
    allow_any: bool = False
    idle_timeout: float = 30.0
    relay: str | None = None
    """``host:port`` of a relay to publish our record on and accept relayed clients from."""
    advertise: list[str] | None = None
    """Addresses for the record; default: the bound address."""
    resume_grace: float = 30.0
    """Seconds a session outlives its dead connection, waiting for its client to resume."""
    http: tuple[str, int] | None = None
    """Where to serve ``/healthz`` and ``/metrics`` (None: no operator port)."""
    http_token: str | None = None
    """The operator port's bearer token (``--http-token-file``, ``$BURN_REMOTE_HTTP_TOKEN``)."""
    data_dir: str | None = None
    """The data directory (shown in the banner)."""
    ring_port: int | None = 0
    """TCP port of the ring data plane on the --listen host (0: any free one; None: off,
    group links carry ring data on QUIC)."""
    ring_advertise: str = ""
    """``HOST:PORT`` ring neighbours dial for the data plane instead (port mapping)."""
    ring_seal_loopback: bool = False
    """Encrypt same-host ring data links too."""
    ring_loopback_tcp: bool = False
    """Same-host ring data links over loopback TCP rather than shared memory."""
    quic_engine: str = "aioquic"
    """QUIC implementation of the connections served (``EndpointConfig.quic_engine``)."""


async def serve(opts: ServeOptions, on_ready: Callable[[Endpoint], None] | None = None) -> None:
    """Serve until cancelled (SIGINT/SIGTERM in ``run``)."""
    policy = opts.authorized_peers
    if not isinstance(policy, AuthorizedPeers):
        policy = AuthorizedPeers(policy, allow_any=opts.allow_any)
    policy.owner = opts.identity.peer_id  # the server's own key is always admitted, as admin
    opts.state.authorized = policy  # jobs and artifacts ask it for the peer's role
    config = EndpointConfig(
        max_frame_size=opts.state.limits.max_frame,
        idle_timeout=opts.idle_timeout,
        keepalive_interval=max(0.2, opts.idle_timeout / 3),
        quic_engine=opts.quic_engine,
    )
    async with (
        Endpoint.open(
            opts.identity,
            bind=opts.bind,
            config=config,
            authorized_peers=policy,
        ) as ep,
        trio.open_nursery() as nursery,
    ):
        if opts.relay:
            from ._relay_glue import start_relay_agent

            await start_relay_agent(nursery, opts, ep)
        from ._group_service import GroupService

        opts.state.collectives = GroupService(
            opts.state,
            ep,
            nursery,
            opts.ring_port,
            opts.ring_advertise,
            opts.ring_seal_loopback,
            not opts.ring_loopback_tcp,
        )
        nursery.start_soon(_close_on_exit, opts.state.collectives.shutdown)
        parking = Parking(opts.resume_grace)
        opts.state.resume_grace = opts.resume_grace
        nursery.start_soon(parking.sweep_loop)
        nursery.start_soon(_heartbeat, opts.state)
        if on_ready is not None:
            on_ready(ep)
        await ep.serve(
            lambda conn: _connection(opts.state, ep, conn, parking), refuse_legacy=refuse_legacy
        )


async def _close_on_exit(close: Callable[[], None]) -> None:
    try:
        await trio.sleep_forever()
    finally:
        close()


async def _heartbeat(state: ServerState) -> None:
    """Tick while the loop turns: a handler that blocked the loop would stop the ticks. Each
    tick also measures how late it woke (``loop_lag``): the loop's real delay, which the
    time since the last tick (0 to HEARTBEAT on an idle server) is not."""
    import time

    from ._status import HEARTBEAT

    while True:
        before = time.monotonic()
        state.heartbeat = before
        await trio.sleep(HEARTBEAT)
        state.loop_lag = max(0.0, time.monotonic() - before - HEARTBEAT)


async def _connection(
    state: ServerState, ep: Endpoint, conn: Connection, parking: Parking | None = None
) -> None:
    try:
        control = await conn.accept_stream()
        first = await control.receive_frame()
        if first is None:
            return
        control.stop_oversized = False  # an oversized control frame is answered (LIMIT)
        if is_group_link(first) and state.collectives is not None:
            await state.collectives.serve_link(conn, control, first)
            return
        policy = state.authorized
        if policy is not None and policy.is_guest_only(conn.peer_id):
            await conn.close("this peer is admitted for device-group links only")
            return
        if _is_fetch(first):
            await _serve_fetch(state, conn, control, first)
            return
        await run_session(state, ep, conn, control, first, _SessionPump, parking or Parking(0))
        log.debug(
            "connection ended", extra={"event": "connection_ended", "peer": str(conn.peer_id)}
        )
    except* TransportError as group:  # the client went away, or the server is stopping
        log.info(
            "connection ended: %s",
            group.exceptions[0],
            extra={"event": "connection_lost", "peer": str(conn.peer_id)},
        )


def _is_fetch(frame: bytes) -> bool:
    try:
        msgs = m.decode(frame)
    except m.DecodeError:
        return False
    return len(msgs) == 1 and isinstance(msgs[0], m.Fetch)


async def _serve_fetch(state: ServerState, conn: Connection, s: FrameStream, frame: bytes) -> None:
    """Source side of a server-to-server move: Data, then the bytes as a bulk transfer on
    the same stream (chunks from a view of the tensor, acknowledged by the fetcher)."""
    reply, send = await trio.to_thread.run_sync(state.serve_fetch, frame, str(conn.peer_id))
    await s.send_frame(reply)
    if send is not None:
        await s.send_frame(send.header())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_drain_acks, s, send)
            for chunk in send.chunks():
                await s.send_frame(chunk)
    await s.close()
    with trio.move_on_after(10):
        await s.receive_frame()  # the fetcher closes once it has the bytes


async def _drain_acks(s: FrameStream, send: BulkSend) -> None:
    while not send.done:
        frame = await s.receive_frame()
        if frame is None:
            return
        try:
            send.on_ack(frame)
        except m.DecodeError as exc:
            raise TransportError(f"fetcher sent a bad BulkAck: {exc}") from None


INLINE_FRAMES = os.environ.get("BURN_REMOTE_INLINE_FRAMES", "1") != "0"
"""Answer cheap control frames on the receive loop (``_SessionPump._inline``); 0 turns it
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
    """Engine work shares trio's default thread limit; job work has its own."""
    if place is Place.ENGINE:
        return trio.to_thread.current_default_thread_limiter()
    try:
        return _JOB_LIMITER.get()
    except LookupError:
        limiter = trio.CapacityLimiter(JOB_WORKERS)
        _JOB_LIMITER.set(limiter)
        return limiter


class _SessionPump:
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
        while True:
            place = session.next_place()
            now = trio.current_time()
            if place is Place.LOOP:
                outs = session.step(now, place)
            else:
                outs = await trio.to_thread.run_sync(
                    session.step, now, place, limiter=_limiter(place)
                )
            await self._emit(outs)
            if session.closed or not session.queue:
                return
            if session.ready():
                continue  # stopped where the next message must run elsewhere
            await self._wait_ready()

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


class DialRefused(Exception):
    """The requesting peer is over its dial rate: answered LIMIT, not CAPABILITY."""


async def fetch_from(ep: Endpoint, session: Session, out: StartFetch) -> Any:
    """Destination side of a server-to-server move: dial the source (at an address this
    server resolves itself, ``dial_peer``), redeem the token, and receive the tensor in
    chunks into a buffer charged to the session; (dtype, shape, buffer), or the source's
    refusal as a string."""
    try:
        conn = await dial_peer(ep, session.state, out.source_peer, requester=session.peer_id)
    except LimitExceeded as exc:  # the peer's dial rate: its own code, not the source's
        raise DialRefused(str(exc)) from None
    try:
        s = await conn.open_stream()
        await s.send_frame(m.encode(m.Fetch(0, str(ep.peer_id), "", out.token)))
        (msg,) = m.decode(await s.receive_frame() or b"")
        if isinstance(msg, m.Error):
            return msg.message
        if not isinstance(msg, m.Data):
            return f"unexpected {type(msg).__name__} from the source"
        if not msg.bulk_id:
            buffer = np.frombuffer(msg.data, np.uint8).copy()
            session.reserve(buffer.nbytes)
            return (msg.dtype, msg.shape, buffer)
        header = parse_header(await s.receive_frame())
        session.reserve(header.size)
        try:
            rx = BulkReceive(header.bulk_id, header.size)
            rx.start(header)
            while not rx.done:
                chunk = await s.receive_frame()
                if chunk is None:
                    raise TransportError(f"the source ended the transfer at {rx.received}")
                ack = rx.feed(chunk)
                if ack is not None:
                    await s.send_frame(ack)
        except BaseException:
            session.release(header.size)
            raise
        return (msg.dtype, msg.shape, rx.buffer)
    finally:
        await conn.close("fetched", flush_timeout=2.0)


def run(opts: ServeOptions, device: str) -> int:
    """Serve until SIGINT/SIGTERM; print the peer id and addresses once listening. An
    address that cannot be bound (busy, not local) is one line on stderr and status 1."""
    listening = False

    port_http = None
    if opts.http is not None:
        from ._http import OperatorPort, warn_if_open

        warn_if_open(opts.http, opts.http_token, "burn-remote serve")
        try:
            port_http = OperatorPort(opts.state, opts.http, token=opts.http_token)
        except OSError as exc:
            where = format_host_port(*opts.http)
            print(f"burn-remote serve: cannot serve --http on {where}: {exc}", file=sys.stderr)
            return 1

    def ready(ep: Endpoint) -> None:
        nonlocal listening
        listening = True
        host, port = ep.local_address[:2]
        shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        print(f"burn-remote serve: device {device}", flush=True)
        print(f"peer id: {ep.peer_id}", flush=True)
        print(f"listening on: {host}:{port}", flush=True)
        print(f"auth: {_auth_mode(opts)}", flush=True)
        print(f"quic engine: {opts.quic_engine}", flush=True)
        groups = opts.state.collectives
        if groups is not None and groups.listener is not None:
            rh, rp = groups.listener.address
            print(f"ring data: tcp {format_host_port(rh, rp)}", flush=True)
        else:
            print("ring data: quic (--ring-port off)", flush=True)
        jobs = "jobs on" if opts.state.jobs is not None else "jobs off"
        print(f"data dir: {opts.data_dir or '(none)'} ({jobs})", flush=True)
        if port_http is not None:
            h, p = port_http.address
            print(f"http: http://{format_host_port(h, p)} (/healthz, /metrics)", flush=True)
        print(f"connect with: RemoteDevice('{ep.peer_id}@{shown}:{port}')", flush=True)
        log.info(
            "serving on %s:%d",
            host,
            port,
            extra={"event": "server_started", "peer": str(ep.peer_id)},
        )

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve, opts, ready)
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    print(
                        f"burn-remote serve: {signal.Signals(signum).name}, shutting down",
                        flush=True,
                    )
                    nursery.cancel_scope.cancel()
                    break

    sys.setswitchinterval(SWITCH_INTERVAL)
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        trio.run(main)
    except BaseException as exc:
        bind_error = None if listening else _first_os_error(exc)
        if bind_error is None:
            raise
        host, port = opts.bind
        why = bind_error.strerror or str(bind_error)
        hint = " (another server there? give this one --listen HOST:PORT)" if port else ""
        print(f"burn-remote serve: cannot listen on {host}:{port}: {why}{hint}", file=sys.stderr)
        return 1
    finally:
        if port_http is not None:
            port_http.close()
    log.info("stopped", extra={"event": "server_stopped"})
    sys.stdout.flush()
    return 0


def _first_os_error(exc: BaseException) -> OSError | None:
    """The OSError inside ``exc`` (trio wraps a failed start in exception groups)."""
    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _first_os_error(inner)
            if found is not None:
                return found
    return None


def _auth_mode(opts: ServeOptions) -> str:
    """The banner's one line on who is admitted."""
    peers = opts.authorized_peers
    if opts.allow_any or getattr(peers, "allow_any", False):
        return "open: any authenticated peer is admitted (--allow-any)"
    if isinstance(peers, AuthorizedPeers):
        peers = peers._path
    if isinstance(peers, str | os.PathLike):
        return f"authorized peers from {peers}"
    return "authorized peers given in-process"


__all__ = ["ServeOptions", "run", "serve"]
