"""The server connection on qh3: optional.

Why: per datagram, aioquic's Python costs a server ~100-120 us of CPU per round trip on a
small machine (receive ~40, packet build ~50, the rest of transmit ~30); qh3's QUIC core
does that work in native code. qh3 2.x's TLS server never asks for a client certificate;
keys are proven above TLS instead (``_auth``), with nothing of qh3 but its public
``secrets_log_file``, so qh3's TLS runs unmodified.

**The connection** (``Qh3ServerConnection``) offers what the trio ``Connection`` and
``Endpoint`` use of ``PeerQuicConnection``, over qh3's connection. What differs:

* flow control: qh3's core grants credit as data is *delivered* to Python, which is at
  once, not as the application reads (aioquic's windows here follow the driver's
  ``ReceiveLedger``). So a
  peer could make the server buffer without bound; instead the connection is closed with
  FLOW_CONTROL_ERROR and a reason naming the figures once the bytes delivered and not yet
  read pass ``unread_limit`` (see ``UNREAD_LIMIT_FACTOR``);
* the 3x anti-amplification budget before the client's address is proven is kept here,
  over whole datagrams (``_ValidatedQuic._create_core`` says why);
* ACKs and timers are qh3's own (a reply carries the ACK its request is owed; see
  ``get_timer``); so is the limit on concurrent incoming streams (qh3's fixed 100, not
  ``max_streams``).
"""

from __future__ import annotations

import io
import logging
import ssl
from typing import Any

from aioquic.quic import events
from cryptography.hazmat.primitives import serialization
from qh3.quic import events as qh3_events
from qh3.quic.configuration import QuicConfiguration
from qh3.quic.connection import QuicConnection, QuicConnectionError

from ..addressing import SocketAddress
from ._config import ALPN, LEGACY_ALPNS, EndpointConfig
from ._engine import ReceiveLedger
from ._identity import Identity

FLOW_CONTROL_ERROR = 0x3
"""QUIC transport error code for a peer that sent more than it may (RFC 9000 20.1)."""
INTERNAL_ERROR = 0x1
"""QUIC transport error code for a failure of our own (RFC 9000 20.1)."""

PACING_LEAD = 0.001
"""Seconds ahead of the clock a reply qh3's pacer holds back is sent anyway (qh3 is told that
time, and never an earlier one after it). Measured from the real time of the call, not from
the last time qh3 was told: in a loop of trips shorter than the pacer's slot, leads counted
from qh3's clock would add up, one slot per trip, and run its clock (its ACK, loss and idle
timers) ahead without bound; so qh3's clock is never more than this ahead. qh3 paces every
packet by its largest datagram size (~0.1-0.5 ms slots on a fresh loopback connection, and
with an aioquic client, which acknowledges every ~10 ms, on warm ones too), and trio cannot
wake sooner than 1 ms (epoll's resolution): a held reply waited ~1.2 ms, for a slot a tenth
of that. qh3's RTT estimate is floored at 1 ms and its loss timers are tens of ms, so
running its clock up to 1 ms ahead changes neither."""

PACING_SLACK = 2e-6
"""Seconds past the pacer's slot qh3 is told: at the slot's own time, in floating point,
its token bucket can still be a fraction of a byte short, and it holds the packet again."""

PACING_LEAD_STEPS = (PACING_LEAD / 8, PACING_LEAD / 4, PACING_LEAD / 2, PACING_LEAD)
"""Leads tried in turn when the pacer's slot is hidden behind qh3's ACK timer
(``Qh3ServerConnection._pacing_leads``): measured with an aioquic client, a held reply's
slot came within 0.1-0.2 ms in 9 cases out of 10, within 0.5 ms in all but a few."""

PACING_IDLE_WAIT = 0.020
"""Seconds a pacing timer with nothing queued waits before it wakes the connection: qh3
arms one after every packet it sends, and with an aioquic client (whose ACKs come every
~10 ms) that was a trio wake-up per reply, for nothing; what it may hide (an ACK owed to an
aioquic client, which does not wait for ACKs) can wait that long. Loss timers are later."""

log = logging.getLogger("burn_remote.transport")

UNREAD_LIMIT_FACTOR = 2
"""A qh3 server closes a connection whose peer has more than this many times
``connection_window`` (plus the frames readers are waiting for, as aioquic's windows allow)
delivered and not yet read by the application. An aioquic server never lets a peer send
more than one ``connection_window`` beyond what was read (plus those frames), and our
clients pace themselves by the server's replies (``MAX_STEPS_AHEAD`` steps, bulk streams
read as they arrive), so a client of ours does not come near it; a peer that does is
flooding."""


class _ValidatedQuic(QuicConnection):
    """qh3's connection whose core leaves the anti-amplification limit to
    ``Qh3ServerConnection`` (see ``_create_core``)."""

    def _create_core(self, remote_addr: SocketAddress, initial_dcid: bytes, now: float) -> None:
        """qh3's, with the core told the client's address is validated (as after a Retry).

        qh3's core counts only the bytes of the packets it could decrypt towards the 3x
        anti-amplification budget, not the whole datagram (RFC 9000 8.1 says all of it), and
        fails with "packet builder capacity exhausted" when its flight does not fit: an
        aioquic client pads its first datagram with zeros after a ~500-byte Initial, so a
        stock qh3 server cannot answer it. ``Qh3ServerConnection.datagrams_to_send`` keeps
        the budget instead, over whole datagrams. The core reads "validated" from whether a
        Retry was done; that attribute is set only for this call (the transport parameters,
        built later by ``_create_tls``, still say no Retry happened)."""
        retry = self._retry_source_connection_id
        if retry is None:
            self._retry_source_connection_id = b"\0"  # only "is not None" is read here
        try:
            super()._create_core(remote_addr, initial_dcid, now)
        finally:
            self._retry_source_connection_id = retry


class Qh3ServerConnection:
    """A qh3 server connection with the methods ``Connection`` and ``Endpoint`` call."""

    def __init__(
        self,
        configuration: QuicConfiguration,
        *,
        original_destination_connection_id: bytes,
        retry_source_connection_id: bytes | None,
        unread_limit: int,
        ledger: ReceiveLedger | None = None,
    ) -> None:
        quic = _ValidatedQuic(
            configuration=configuration,
            original_destination_connection_id=original_destination_connection_id,
            retry_source_connection_id=retry_source_connection_id,
        )
        self._quic = quic
        self.configuration = configuration
        self.host_cid = quic.host_cid
        self._unread_limit = unread_limit
        self._terminated = False  # a ConnectionTerminated was reported
        self._close_sent = False
        self._data_queued = False
        self._fin_unsent = False  # a FIN written since the last datagram left
        self._clock = 0.0  # the latest time given to qh3 (never goes back; PACING_LEAD)
        self._received = 0  # bytes of datagrams received before the handshake completed
        self._sent = 0  # bytes of datagrams sent meanwhile
        self._held: list[
            tuple[bytes, SocketAddress]
        ] = []  # over the 3x budget: sent when it allows
        self.ledger = ledger or ReceiveLedger()  # the driver's: the unread bound reads it

    # -- what aioquic's connection offers, delegated ------------------------------------------

    def receive_datagram(self, data: bytes, addr: SocketAddress, now: float) -> None:
        """qh3's; once the handshake is complete, through its one-call path (no per-packet
        header parsing in Python). A failure inside qh3 closes this connection only."""
        quic = self._quic
        now = self._clock = max(now, self._clock)
        try:
            if quic._handshake_complete:
                quic.receive_many_datagrams([data], addr, now)
            else:
                self._received += len(data)
                quic.receive_datagram(data, addr, now)
        except (QuicConnectionError, RuntimeError, ValueError) as exc:
            self._core_failed(exc)

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, SocketAddress]]:
        """qh3's datagrams (straight from its core: its Python wrapper only adds qlog
        bookkeeping); until the handshake completed (the client's address is then proven),
        at most three times the bytes received (RFC 9000 8.1): the rest waits for the
        client's next datagram (see ``_ValidatedQuic._create_core``)."""
        self._data_queued = False
        quic = self._quic
        core = quic._core
        real, now = now, max(now, self._clock)
        self._clock = now
        out: list[tuple[bytes, SocketAddress]] = []
        if core is not None:
            try:
                while (transmit := core.poll_transmit(now)) is not None:
                    out.append((transmit[0], transmit[1]))
                if not out and quic._handshake_complete and core.get_send_buffer_size() > 0:
                    for lead in self._pacing_leads(core, real):
                        now = self._clock = lead  # send now what the pacer holds (below)
                        while (transmit := core.poll_transmit(now)) is not None:
                            out.append((transmit[0], transmit[1]))
                        if out:
                            break
            except RuntimeError as exc:
                self._core_failed(exc)
        if out:
            self._fin_unsent = False
        if quic._close_event is not None:
            self._close_sent = bool(out) or self._close_sent
        if self._held:
            out, self._held = self._held + out, []
        if quic._handshake_complete:
            return out
        budget = 3 * self._received - self._sent
        for i, (data, _addr) in enumerate(out):
            if len(data) > budget:
                self._held = out[i:]
                out = out[:i]
                break
            budget -= len(data)
            self._sent += len(data)
        return out

    def _pacing_leads(self, core: Any, real: float) -> tuple[float, ...]:
        """Times to tell qh3, earliest first, so that queued data its pacer holds goes now:
        none where nothing is to gain (the pacer's slot is further than ``PACING_LEAD``, the
        congestion window is full, qh3's clock is already that far ahead).

        While an ACK is owed, qh3's ``get_timer`` reports the ACK timer (~1 ms after the
        request) and not the pacer's earlier slot: an aioquic client, whose ACKs ride a
        request only every ~10 ms, has one owed whenever its request arrives, so a reply
        the pacer held waited for the ACK timer (~15 % of replies). The slot is then unknown,
        and the lead is tried in steps (``PACING_LEAD_STEPS``): jumping the whole lead at
        once spent it in one trip (qh3's clock stayed ahead, its pacer saw no time pass,
        and the next replies were held again). The ACK owed rides the reply."""
        timer = core.get_timer()
        if timer is None:
            return ()
        kind, at = timer
        if kind == "pacing":
            at = max(at, self._clock) + PACING_SLACK  # at the slot itself qh3 may fall short
            return (at,) if at - real <= PACING_LEAD else ()  # from real time: never further
        if core.bytes_in_flight >= core.congestion_window:
            return ()  # held by the window, not the pacer: the next ACK frees it
        clock = self._clock
        return tuple(t for step in PACING_LEAD_STEPS if (t := real + step) > clock)

    def _core_failed(self, exc: Exception) -> None:
        """qh3 raised (a bug of its, or a peer that found one): this connection ends with
        INTERNAL_ERROR and the reason; the endpoint and every other connection go on."""
        reason = f"server QUIC error: {exc}"
        log.warning("qh3 connection failed: %s", exc)
        try:
            self._quic.close(error_code=INTERNAL_ERROR, reason_phrase=reason)
        except (QuicConnectionError, RuntimeError, AssertionError):
            self._quic._close_event = qh3_events.ConnectionTerminated(INTERNAL_ERROR, None, reason)

    def get_timer(self) -> float | None:
        """qh3's own timer. (Holding its ACK timer, as the qh3 client does, bought nothing
        here: every request's ACK rides on its reply; and a qh3 client then waited up to
        ``ACK_DELAY`` for the ACK of a packet that had no reply, ~10 % of round trips.)"""
        quic = self._quic
        core = quic._core
        timer = None if core is None else core.get_timer()
        if core is None or timer is None:
            return None
        kind, at = timer
        if kind == "pacing" and quic._handshake_complete and core.get_send_buffer_size() == 0:
            return at + PACING_IDLE_WAIT  # nothing to pace: no wake-up for it (see above)
        return at

    def handle_timer(self, now: float) -> None:
        now = self._clock = max(now, self._clock)
        try:
            self._quic.handle_timer(now)
        except (QuicConnectionError, RuntimeError) as exc:
            self._core_failed(exc)

    def send_stream_data(self, stream_id: int, data: Any, end_stream: bool = False) -> None:
        try:
            self._quic.send_stream_data(stream_id, data, end_stream)
        except QuicConnectionError as exc:  # a stream the peer stopped or reset
            raise ValueError(exc.reason_phrase) from None
        self._data_queued = True
        self._fin_unsent = self._fin_unsent or end_stream

    def send_ping(self, uid: int) -> None:
        """A PING; none on a connection qh3 has closed already (an idle timeout its timer
        ran, whose event the driver has not taken yet): qh3 raises there, aioquic does not,
        and the keep-alive loop's raise ended the whole server."""
        try:
            self._quic.send_ping(uid)
        except (QuicConnectionError, RuntimeError):
            pass  # the close reaches the driver as its event

    def stop_stream(self, stream_id: int, error_code: int) -> None:
        try:
            self._quic.stop_stream(stream_id, error_code)
        except QuicConnectionError:
            pass  # the stream is already gone: nothing to stop

    def reset_stream(self, stream_id: int, error_code: int) -> None:
        try:
            self._quic.reset_stream(stream_id, error_code)
        except QuicConnectionError:
            pass

    def close(self, error_code: int = 0, reason_phrase: str = "") -> None:
        self._quic.close(error_code=error_code, reason_phrase=reason_phrase)

    def next_event(self) -> events.QuicEvent | None:
        """qh3's next event as aioquic's event class (the driver speaks aioquic's). A close
        (the peer's CONNECTION_CLOSE, a TLS alert, ours) is reported as soon as qh3 knows
        of it, as aioquic does: qh3 itself reports it only after the draining period."""
        while True:
            e = self._quic.next_event()
            if isinstance(e, qh3_events.StreamDataReceived):
                if self._over_limit(len(e.data)):
                    continue  # the connection is closed: the termination comes next
                return events.StreamDataReceived(e.data, e.end_stream, e.stream_id)
            if isinstance(e, qh3_events.ConnectionIdIssued):
                return events.ConnectionIdIssued(e.connection_id)
            if isinstance(e, qh3_events.ConnectionIdRetired):
                return events.ConnectionIdRetired(e.connection_id)
            if isinstance(e, qh3_events.StreamReset):
                return events.StreamReset(e.error_code, e.stream_id)
            if isinstance(e, qh3_events.StopSendingReceived):
                return events.StopSendingReceived(e.error_code, e.stream_id)
            if isinstance(e, qh3_events.HandshakeCompleted):
                return events.HandshakeCompleted(e.alpn_protocol, False, False)
            closed = self._quic._close_event if e is None else e
            if isinstance(closed, qh3_events.ConnectionTerminated):  # (e's, or qh3's pending)
                if self._terminated:
                    if e is None:
                        return None
                    continue
                self._terminated = True
                return events.ConnectionTerminated(
                    closed.error_code, closed.frame_type, closed.reason_phrase
                )
            if e is None:
                return None

    def _over_limit(self, arriving: int) -> bool:
        """Whether delivering ``arriving`` more bytes would pass the unread bound; if so the
        connection is closed (FLOW_CONTROL_ERROR) and the termination is the next event."""
        unread = self.ledger.buffered + arriving
        limit = self._unread_limit + self.ledger.frame_credit_total
        if unread <= limit:
            return False
        reason = (
            f"peer sent {unread} bytes the server has not read yet (limit {limit}); "
            "a peer must wait for replies before it sends more"
        )
        self._quic.close(error_code=FLOW_CONTROL_ERROR, reason_phrase=reason)
        while self._quic.next_event() is not None:
            pass  # nothing more is delivered from a connection we closed
        return True

    # -- what PeerQuicConnection adds ---------------------------------------------------------

    @property
    def handshake_confirmed(self) -> bool:
        return self._quic._handshake_confirmed

    @property
    def first_flight_accepted(self) -> bool:
        """Whether the received Initial decrypted and its ClientHello was accepted."""
        core = self._quic._core
        return (
            core is not None
            and core.received_authenticated_packet
            and self._quic._close_event is None
        )

    @property
    def is_client(self) -> bool:
        return False

    @property
    def close_pending(self) -> bool:
        return self._quic._close_event is not None and not self._close_sent

    @property
    def data_queued(self) -> bool:
        return self._data_queued

    def open_bidi_stream(self) -> int:
        return self._quic._open_stream()

    def finish_stream(self, stream_id: int) -> None:
        self.send_stream_data(stream_id, b"", end_stream=True)

    def sender_buffered(self, stream_id: int) -> int:
        """Bytes of this stream qh3 has not sent yet, plus everything in flight (qh3 does not
        say per stream what awaits an acknowledgement), and at least 1 while a FIN written
        since the last datagram left may still be queued: qh3 does not count a FIN it has not
        sent (the pacer may hold it), and a graceful close that went ahead then cut the
        stream's end off."""
        quic = self._quic
        core = quic._core
        if core is None or quic._close_event is not None:
            return 0
        pending = quic.get_send_buffer_size(stream_id) + core.bytes_in_flight
        return max(pending, int(self._fin_unsent))

    def unacknowledged(self) -> bool:
        """Whether anything written is unsent or unacknowledged (a FIN the pacer holds
        included; see ``sender_buffered``)."""
        quic = self._quic
        if quic._core is None or quic._close_event is not None:
            return False
        return self._fin_unsent or quic.get_send_buffer_size() > 0 or quic._core.bytes_in_flight > 0

    def send_due(self, now: float) -> bool:
        return self.send_due_at(now, self.get_timer())

    def send_due_at(self, now: float, timer: float | None) -> bool:
        """During the handshake or a close, a due timer, or data queued."""
        quic = self._quic
        if not quic._handshake_confirmed or self.close_pending:
            return True
        if timer is not None and timer <= now:
            return True
        return quic._core is not None and quic.get_send_buffer_size() > 0

    def window_update_due(self, stream_id: int) -> bool:
        return False  # qh3's core grants credit as it delivers (module doc)

    def ack_now(self, now: float) -> None:
        pass  # qh3 acknowledges on its own timer (get_timer)


def qh3_server_configuration(
    identity: Identity, config: EndpointConfig, size: int, secrets: io.TextIOBase
) -> QuicConfiguration:
    """qh3 settings for a server connection: our certificate, ALPN, windows, sizes, and
    the sink of its TLS key log (the key proofs' binding, ``_auth``)."""
    configuration = QuicConfiguration(
        alpn_protocols=[ALPN, *LEGACY_ALPNS],
        is_client=False,
        verify_mode=ssl.CERT_NONE,  # no client certificates: keys are proven above TLS
        # (the stub asks for typing.TextIO; the key log only calls write() and flush())
        secrets_log_file=secrets,  # type: ignore[arg-type]
        idle_timeout=config.idle_timeout,
        max_data=config.connection_window,
        max_stream_data=config.stream_window,
        max_datagram_size=size,
    )
    configuration.load_cert_chain(
        identity.certificate().public_bytes(serialization.Encoding.PEM),
        identity.private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    return configuration


def qh3_server_connection(
    identity: Identity,
    config: EndpointConfig,
    size: int,
    *,
    original_destination_connection_id: bytes,
    retry_source_connection_id: bytes | None,
    secrets: io.TextIOBase,
    ledger: ReceiveLedger | None = None,
) -> Qh3ServerConnection:
    """The qh3 connection a server answers a client's first Initial with."""
    return Qh3ServerConnection(
        qh3_server_configuration(identity, config, size, secrets),
        original_destination_connection_id=original_destination_connection_id,
        retry_source_connection_id=retry_source_connection_id,
        unread_limit=UNREAD_LIMIT_FACTOR * config.connection_window,
        ledger=ledger,
    )
