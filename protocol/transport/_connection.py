"""One authenticated QUIC connection driven from trio: events in, datagrams out, one timer.

The endpoint feeds received datagrams into ``_quic`` and then calls ``_process_events`` and
``_transmit`` once per batch; application calls (send, read, close) call ``_transmit``
themselves. A connection owns a nursery (timer, keep-alive and, on a server, the handler)
that ends when the connection terminates.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio
from aioquic.quic import events

from ..addressing import Address, SocketAddress
from ._auth import AUTH_REFUSED, PREAUTH_BYTES, VERSION_REFUSED, AuthFailure, PeerAuth
from ._config import ALPN, LEGACY_ALPNS, EndpointConfig
from ._engine import EndpointEngine, ReceiveLedger
from ._errors import PeerRejected, TransportError
from ._identity import PeerId
from ._streams import FrameStream
from ._termination import termination_error

if TYPE_CHECKING:
    from ._endpoint import Endpoint

log = logging.getLogger("burn_remote.transport")

Handler = Callable[["Connection"], Awaitable[None]]
LegacyRefusal = Callable[[bytes], bytes]
"""What a server answers to the first frame of a client that offered only an older ALPN
(``LEGACY_ALPNS``): the frame payload it sends back before it closes the connection."""


class Connection:
    """An authenticated connection to one peer; ``peer_id`` is the key it proved it holds."""

    def __init__(
        self,
        endpoint: Endpoint,
        quic: EndpointEngine,
        addr: SocketAddress,
        config: EndpointConfig,
        auth: PeerAuth,
        ledger: ReceiveLedger,
        handler: Handler | None = None,
        refuse_legacy: LegacyRefusal | None = None,
    ) -> None:
        self._ep = endpoint
        self._quic = quic
        self._auth = auth
        self._ledger = ledger
        self._refuse_legacy = refuse_legacy
        self._alpn: str | None = None  # negotiated, once the handshake got that far
        self._preauth = 0  # application bytes received before the peer proved its key
        self._addr = addr
        self._config = config
        self._handler = handler
        self._is_client = quic.is_client
        self._streams: dict[int, FrameStream] = {}
        self._incoming_send, self._incoming = trio.open_memory_channel[FrameStream](math.inf)
        self._send_space = trio.lowlevel.ParkingLot()
        self._ready = trio.Event()  # handshake confirmed, or terminated
        self._terminated = trio.Event()
        self._error: TransportError | None = None
        self._closing: str | None = None  # our close reason, until the peer's ack/timeout
        self._timer_at: float | None = None  # QUIC's timer
        self._armed = math.inf  # the deadline _timer_scope wakes at (never later than that)
        self._timer_scope = trio.CancelScope()
        self._cids: set[bytes] = set()
        self._in_events = False  # inside _process_events (its caller transmits after it)
        self._ping_uid = 0
        self.peer_id: PeerId | None = None

    def __repr__(self) -> str:
        return f"<Connection {self.peer_id or '?'} at {self.remote_address}>"

    @property
    def remote_address(self) -> Address:
        """The peer's UDP address (host, port)."""
        return self._addr[:2]

    @property
    def is_closed(self) -> bool:
        return self._error is not None

    @property
    def is_unproven(self) -> bool:
        """Open, and its peer has not proven its key (yet, or ever: an older client's)."""
        return self.peer_id is None and self._error is None

    @property
    def close_reason(self) -> TransportError | None:
        """Why the connection ended, once it has."""
        return self._error

    # -- application API -------------------------------------------------------------------

    async def open_stream(self) -> FrameStream:
        """A new bidirectional stream; the peer sees it with its first frame."""
        self._check_open()
        stream = self._new_stream(self._quic.open_bidi_stream())
        await trio.lowlevel.checkpoint()
        return stream

    async def accept_stream(self) -> FrameStream:
        """Wait for the next stream the peer opened.

        Raises:
            TransportError: the connection closed (the reason is the peer's or ours).
        """
        try:
            return await self._incoming.receive()
        except trio.EndOfChannel:
            raise self._error or TransportError("connection closed") from None

    async def close(self, reason: str = "", *, flush_timeout: float = 5.0) -> None:
        """Close gracefully: wait (up to ``flush_timeout``) for sent data to be acknowledged,
        then send CONNECTION_CLOSE with ``reason``, which the peer sees in its error text."""
        quic = self._quic
        if self._error is None and quic.handshake_confirmed:
            with trio.move_on_after(flush_timeout):
                # Streams already released count too (``unacknowledged``): a stream whose
                # last frame and FIN were written just before (a handler's reply) is gone
                # from ``_streams``, and qh3's pacer may still hold its FIN.
                while self._error is None and (
                    any(quic.sender_buffered(sid) for sid in self._streams) or quic.unacknowledged()
                ):
                    await self._send_space.park()
        self._close_now(VERSION_REFUSED if self.is_legacy else 0, reason or "closed by peer")
        await trio.lowlevel.checkpoint()

    async def wait_closed(self) -> TransportError:
        """Wait until the connection has terminated; returns the reason."""
        await self._terminated.wait()
        assert self._error is not None
        return self._error

    async def ping(self) -> None:
        """Send a PING now (keep-alive is automatic; this is for tests and tools)."""
        self._check_open()
        self._ping_uid += 1
        self._quic.send_ping(self._ping_uid)
        self._transmit()
        await trio.lowlevel.checkpoint()

    # -- helpers used by FrameStream -------------------------------------------------------

    def _is_open(self) -> bool:
        return self._error is None and self._closing is None

    def _check_open(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closing is not None:
            raise TransportError(f"connection is closing: {self._closing}")

    def _consumed(self, stream_id: int, n: int) -> None:
        self._ledger.read(stream_id, n)
        if self._error is None and self._quic.window_update_due(stream_id):
            self._transmit()

    def _set_frame_credit(self, stream_id: int, n: int) -> None:
        """Let a frame of ``n`` bytes that a reader awaits arrive whole (0 clears)."""
        self._ledger.set_credit(stream_id, n)
        if n and self._error is None and self._quic.window_update_due(stream_id):
            self._transmit()

    def _release(self, sid: int) -> None:
        """Forget a stream both sides finished with (its state would otherwise pile up)."""
        self._streams.pop(sid, None)
        self._ledger.forget(sid)

    def _new_stream(self, sid: int) -> FrameStream:
        stream = FrameStream(self, sid)
        self._streams[sid] = stream
        return stream

    # -- driver ----------------------------------------------------------------------------

    def _close_now(self, code: int, reason: str) -> None:
        if self._error is None and self._closing is None:
            self._closing = reason
            self._quic.close(error_code=code, reason_phrase=reason)
            self._transmit()

    def _transmit(self) -> None:
        """Send everything aioquic has ready, then re-arm the single timer."""
        quic = self._quic
        now = trio.current_time()
        datagrams = quic.datagrams_to_send(now)
        if datagrams:
            self._ep._send_batch(datagrams)
        self._arm(quic.get_timer())

    def _arm(self, t: float | None) -> None:
        """Make the single timer fire at ``t`` (aioquic's ``get_timer()``).

        The armed deadline only ever moves earlier here: in request/reply traffic QUIC's
        timer moves a little later with every packet (the loss timer of the newest one),
        and moving a trio deadline costs more than the rest of this call. A deadline left
        early wakes ``_timer_loop`` once, which finds the timer not due and re-arms it."""
        self._timer_at = t
        if t is not None and t < self._armed:
            self._armed = self._timer_scope.deadline = t

    def _process_events(self) -> None:
        """Apply aioquic's events; the caller transmits afterwards (once for all of them)."""
        self._in_events = True
        try:
            self._drain_events()
        finally:
            self._in_events = False

    def _drain_events(self) -> None:
        quic = self._quic
        while (event := quic.next_event()) is not None:
            if isinstance(event, events.StreamDataReceived):
                if self._error is not None:
                    continue  # refused a moment ago (below): nothing more is taken
                if event.stream_id == self._auth.peer_stream:
                    self._feed_auth(event)
                    continue
                if self.peer_id is None:
                    self._preauth += len(event.data)
                    if self._preauth > PREAUTH_BYTES:
                        self._refuse(f"more than {PREAUTH_BYTES} bytes sent before the key proof")
                        continue
                self._ledger.buffered += len(event.data)
                stream = self._streams.get(event.stream_id)
                if stream is None:
                    sid = event.stream_id
                    # Released streams get no more events (aioquic drops frames for
                    # finished streams), so an unknown id is a new stream from the peer.
                    if (sid & 1) != self._is_client:
                        self._consumed(sid, len(event.data))
                        continue
                    stream = self._new_stream(sid)
                    self._incoming_send.send_nowait(stream)
                stream._feed(event.data, event.end_stream)
            elif isinstance(event, events.ConnectionIdIssued):
                self._cids.add(event.connection_id)
                self._ep._register_cid(event.connection_id, self)
            elif isinstance(event, events.ConnectionIdRetired):
                self._cids.discard(event.connection_id)
                self._ep._forget_cid(event.connection_id)
            elif isinstance(event, events.StreamReset):
                stream = self._streams.get(event.stream_id)
                if stream is not None:
                    stream._fail(TransportError(f"peer reset stream {event.stream_id}"))
            elif isinstance(event, events.StopSendingReceived):
                stream = self._streams.get(event.stream_id)
                if stream is not None:
                    stream._fail(TransportError(f"peer stopped reading stream {event.stream_id}"))
            elif isinstance(event, events.ConnectionTerminated):
                self._on_terminated(event)
            elif isinstance(event, (events.ProtocolNegotiated, events.HandshakeCompleted)):
                self._alpn = event.alpn_protocol
        if not self._ready.is_set() and self._error is None:
            self._authenticate()
        if self._send_space:
            self._send_space.unpark_all()

    # -- authentication (``_auth``) ----------------------------------------------------------

    @property
    def is_legacy(self) -> bool:
        """Server side: the client offered only an older transport (``LEGACY_ALPNS``)."""
        return self._alpn in LEGACY_ALPNS

    def _authenticate(self) -> None:
        """Send our key proof once the handshake has the binding; ready once the peer's
        proof checked out (or, for a legacy client, once the handshake is done)."""
        auth, quic = self._auth, self._quic
        if self._alpn == ALPN:  # a server learns the ALPN with the ClientHello
            proof = auth.proof_due()
            if proof is not None:
                quic.send_stream_data(auth.our_stream, proof, end_stream=self._is_client)
            if auth.admit_due():  # the end of our auth stream tells the client it is in
                quic.send_stream_data(auth.our_stream, b"", end_stream=True)
        if not quic.handshake_confirmed or self._closing is not None:
            return
        if auth.done:
            self.peer_id = auth.peer_id
            self._ready.set()
        elif self.is_legacy and not self._is_client:
            self._ready.set()

    def _feed_auth(self, event: events.StreamDataReceived) -> None:
        self._consumed(event.stream_id, len(event.data))
        try:
            self._auth.feed(event.data, event.end_stream)
        except AuthFailure as exc:
            self._refuse(str(exc))

    def _refuse(self, reason: str) -> None:
        """Close because a key proof failed (or a stranger overstepped), telling the peer why;
        a ``connect`` waiting on it raises ``PeerRejected`` with the same reason."""
        self._close_now(AUTH_REFUSED, reason)
        host, port = self.remote_address
        self._fail(PeerRejected(f"connection to {host}:{port}: {reason}"))

    def _on_terminated(self, event: events.ConnectionTerminated) -> None:
        if self._error is not None:
            return
        host, port = self.remote_address
        self._fail(termination_error(event, f"connection to {host}:{port}"))

    def _fail(self, error: TransportError) -> None:
        if self._error is not None:
            return
        self._error = error
        self._incoming_send.close()
        for stream in self._streams.values():
            stream._fail(self._error)
        self._send_space.unpark_all()
        self._ready.set()
        self._terminated.set()

    def _abandon(self, reason: str) -> None:
        """Terminate without waiting for the closing period (handshake timeout, shutdown)."""
        if self._error is None:
            self._close_now(0, reason)
            self._on_terminated(
                events.ConnectionTerminated(error_code=0, frame_type=None, reason_phrase=reason)
            )

    async def _run(self) -> None:
        """The connection's life: timers, handshake deadline, keep-alive, handler."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._timer_loop)
                nursery.start_soon(self._cancel_when_terminated, nursery.cancel_scope)
                with trio.move_on_after(self._config.handshake_timeout):
                    await self._ready.wait()
                if not self._ready.is_set():
                    limit = self._config.handshake_timeout
                    if self._quic.handshake_confirmed:  # TLS is done, a key proof is not
                        self._refuse(f"no key proof within {limit:g} s")
                    else:
                        self._abandon(f"no handshake within {limit:g} s")
                    return
                if self._config.keepalive_interval is not None:
                    nursery.start_soon(self._keepalive_loop)
                if self.is_legacy and not self._is_client:
                    nursery.start_soon(self._run_legacy)
                elif self._handler is not None and self._error is None:
                    nursery.start_soon(self._run_handler)
        finally:
            self._ep._forget(self)

    async def _cancel_when_terminated(self, scope: trio.CancelScope) -> None:
        await self._terminated.wait()
        scope.cancel()

    async def _timer_loop(self) -> None:
        while True:
            self._armed = math.inf if self._timer_at is None else self._timer_at
            self._timer_scope = trio.CancelScope(deadline=self._armed)
            with self._timer_scope:
                await trio.sleep_forever()
            now = trio.current_time()
            if self._timer_at is not None and now >= self._timer_at:
                self._quic.handle_timer(now)
                self._process_events()
                self._transmit()

    async def _keepalive_loop(self) -> None:
        assert self._config.keepalive_interval is not None
        while True:
            await trio.sleep(self._config.keepalive_interval)
            if self._closing is not None:
                return
            self._ping_uid += 1
            self._quic.send_ping(self._ping_uid)
            self._transmit()

    async def _run_legacy(self) -> None:
        """A client of an older transport: answer its first frame with what the server's
        ``refuse_legacy`` says (its protocol's version error), then close. It never reaches
        the handler, and gets ``handshake_timeout`` to send that frame."""
        reason = (
            f"this server speaks {ALPN}; the client offered only {self._alpn}: "
            "upgrade burn-remote on the client"
        )
        if self._refuse_legacy is not None:
            with trio.move_on_after(self._config.handshake_timeout):
                try:
                    stream = await self.accept_stream()
                    first = await stream.receive_frame()
                    if first is not None:
                        await stream.send_frame(self._refuse_legacy(first))
                except TransportError:
                    return
        await self.close(reason, flush_timeout=1.0)

    async def _run_handler(self) -> None:
        assert self._handler is not None
        try:
            await self._handler(self)
        except TransportError as exc:
            log.info("connection from %s ended: %s", self.peer_id, exc)
        except Exception:
            # One client's failure must not take the server down; it is logged, and the
            # client sees the connection close with a reason.
            log.exception("handler failed for peer %s", self.peer_id)
            self._close_now(0x1, "server handler failed")
            return
        await self.close("handler finished")
