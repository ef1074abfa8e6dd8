"""The server connection on qh3, with our mutual authentication added to its TLS: optional.

Why: per datagram, aioquic's Python costs a server ~100-120 us of CPU per round trip on a
small machine (receive ~40, packet build ~50, the rest of transmit ~30); qh3's QUIC core
does that work in native code. What stood in the way: qh3 2.x's TLS server never sends a
CertificateRequest, and our security model is mutual Ed25519 authentication inside TLS.

**What the TLS override adds** (``_ClientAuthContext``, on qh3's own ``tls.Context``; its
TLS is Python, so the override is an ordinary subclass, installed by ``_AuthQuic._create_tls``
on the object qh3 just made):

* the server's flight gets a CertificateRequest (Ed25519 only) right after
  EncryptedExtensions, as RFC 8446 4.3.2 requires. qh3 writes the whole flight in one call,
  ``_server_handle_hello``; while it runs, the transcript's ``update_hash`` is tapped on this
  connection's key schedule only: when EncryptedExtensions has been hashed, the request is
  written to the same buffer and hashed too, so the server's CertificateVerify and Finished
  cover it;
* qh3 then *anticipates* the client's Finished as if no certificate followed (it hashes the
  Finished it expects); the transcript is rolled back to the server's Finished (a copy taken
  at the tap) and qh3's expected Finished is forgotten, so a client that ignores the request
  cannot finish;
* the client's second flight is read by ``handle_message`` here until the certificate
  checks passed: Certificate (an empty one: ``certificate_required``; not an Ed25519 key:
  ``bad_certificate``), CertificateVerify (Ed25519 over the transcript up to the client's
  Certificate, checked with ``cryptography``: ``decrypt_error``), then ``authorize`` (the
  peer id: ``access_denied`` with its reason). Only then is the client's Finished computed
  and left to qh3's own ``_server_handle_finished``. A failure is a TLS alert raised before
  the client's Finished is accepted, so the handshake never completes and no application
  byte is read or sent; the client gets a CONNECTION_CLOSE with the alert and our reason;
* session tickets stay off (no resumption handshake may skip the certificate);
* a ClientHello without our ALPN gets ``no_application_protocol`` (RFC 9001 8.1; qh3 says
  ``handshake_failure``), as from the aioquic server.

Both client engines answer the request with their Ed25519 certificate (tested).

**The connection** (``Qh3ServerConnection``) offers what the trio ``Connection`` and
``Endpoint`` use of ``PeerQuicConnection``, over qh3's connection. What differs:

* flow control: qh3's core grants credit as data is *delivered* to Python, which is at
  once, not as the application reads (aioquic's windows here follow ``app_consumed``). So a
  peer could make the server buffer without bound; instead the connection is closed with
  FLOW_CONTROL_ERROR and a reason naming the figures once the bytes delivered and not yet
  read pass ``unread_limit`` (see ``UNREAD_LIMIT_FACTOR``);
* the 3x anti-amplification budget before the client's address is proven is kept here,
  over whole datagrams (``_AuthQuic._create_core`` says why);
* ACKs and timers are qh3's own (a reply carries the ACK its request is owed; see
  ``get_timer``); so is the limit on concurrent incoming streams (qh3's fixed 100, not
  ``max_streams``).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from typing import Any

from aioquic.quic import events
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from qh3 import tls
from qh3._hazmat import Buffer
from qh3.quic import events as qh3_events
from qh3.quic.configuration import QuicConfiguration
from qh3.quic.connection import QuicConnection, QuicConnectionError

from ._config import ALPN, EndpointConfig
from ._errors import TransportError
from ._identity import Identity, PeerId, peer_id_of_certificate
from ._quic import Authorize

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


class _AlertAccessDenied(tls.Alert):
    description = tls.AlertDescription.access_denied


class _AlertCertificateRequired(tls.Alert):
    description = tls.AlertDescription.certificate_required


class _AlertNoApplicationProtocol(tls.Alert):
    description = tls.AlertDescription.no_application_protocol


def _push_certificate_request(buf: Buffer) -> None:
    """A CertificateRequest (RFC 8446 4.3.2): empty context, Ed25519 signatures only."""
    buf.push_uint8(tls.HandshakeType.CERTIFICATE_REQUEST)
    with tls.push_block(buf, 3):
        tls.push_opaque(buf, 1, b"")
        with (
            tls.push_block(buf, 2),
            tls.push_extension(buf, tls.ExtensionType.SIGNATURE_ALGORITHMS),
        ):
            tls.push_list(buf, 2, buf.push_uint16, [tls.SignatureAlgorithm.ED25519])


class _ClientAuthContext(tls.Context):
    """qh3's server TLS plus the client certificate (module doc); set up by ``_AuthQuic``."""

    authorize: Authorize | None
    peer_id: PeerId | None
    _auth_step: str | None  # what the client's second flight must bring next
    _flight: Buffer | None  # the buffer qh3 writes its handshake flight into
    _server_finished: Any  # the transcript hash right after the server's Finished
    _client: PeerId | None

    def _setup_auth(self, authorize: Authorize | None) -> None:
        self.authorize = authorize
        self.peer_id = self._client = None
        self._auth_step = None
        self._flight = self._server_finished = None
        self.get_session_ticket_cb = None  # no resumption: every client shows its key
        self.new_session_ticket_cb = None

    # -- the server's flight ---------------------------------------------------------------

    def _server_handle_hello(self, input_buf, initial_buf, handshake_buf, onertt_buf) -> None:
        hello = tls.pull_client_hello(Buffer(data=input_buf.data_slice(0, input_buf.capacity)))
        if ALPN not in (hello.alpn_protocols or ()):  # qh3 would say handshake_failure
            raise _AlertNoApplicationProtocol(f"No common ALPN protocols (this is {ALPN})")
        self._flight = handshake_buf
        try:
            super()._server_handle_hello(input_buf, initial_buf, handshake_buf, onertt_buf)
        finally:
            self._flight = None
        if self._auth_step != "certificate" or self._server_finished is None:
            raise tls.AlertInternalError("server flight written without a CertificateRequest")
        self.key_schedule.hash = self._server_finished  # forget the anticipated Finished
        self._expected_verify_data = None  # qh3's guess; computed once the client is checked

    def _setup_traffic_protection(self, direction, epoch, label) -> None:
        super()._setup_traffic_protection(direction, epoch, label)
        if (
            self._flight is not None
            and direction == tls.Direction.DECRYPT
            and epoch == tls.Epoch.HANDSHAKE
        ):
            # The next message qh3 hashes is EncryptedExtensions (see the module doc).
            self.key_schedule.update_hash = self._tap_flight

    def _tap_flight(self, data: bytes) -> None:
        schedule = self.key_schedule
        tls.KeySchedule.update_hash(schedule, data)
        if data[0] == tls.HandshakeType.ENCRYPTED_EXTENSIONS:
            buf = self._flight
            assert buf is not None
            start = buf.tell()
            _push_certificate_request(buf)
            tls.KeySchedule.update_hash(schedule, buf.data_slice(start, buf.tell()))
            self._auth_step = "certificate"
        elif data[0] == tls.HandshakeType.FINISHED:
            del schedule.update_hash  # back to the class's method
            self._server_finished = schedule.hash.copy()

    # -- the client's second flight --------------------------------------------------------

    def handle_message(self, input_data: bytes, output_buf: dict, epoch: int = -1) -> None:
        if self._auth_step in (None, "finished") or self.state != tls.State.SERVER_EXPECT_FINISHED:
            return super().handle_message(input_data, output_buf, epoch)
        self._receive_buffer += input_data
        while self._auth_step != "finished" and len(self._receive_buffer) >= 4:
            length = 4 + int.from_bytes(self._receive_buffer[1:4], "big")
            if len(self._receive_buffer) < length:
                return
            message = self._receive_buffer[:length]
            self._receive_buffer = self._receive_buffer[length:]
            if epoch >= 0 and epoch != tls.Epoch.HANDSHAKE:
                raise tls.AlertUnexpectedMessage("client flight outside the handshake epoch")
            buf = Buffer(data=message)
            if self._auth_step == "certificate":
                self._client_certificate(message[0], buf)
            else:
                self._client_certificate_verify(message[0], buf)
            if not buf.eof():
                raise tls.AlertDecodeError("extra bytes at the end of a handshake message")
        if self._auth_step == "finished" and self._receive_buffer:
            super().handle_message(b"", output_buf, epoch)  # the Finished: qh3's own check

    def _client_certificate(self, kind: int, buf: Buffer) -> None:
        if kind == tls.HandshakeType.FINISHED:
            raise _AlertCertificateRequired("client sent no certificate; this server requires one")
        if kind != tls.HandshakeType.CERTIFICATE:
            raise tls.AlertUnexpectedMessage("expected the client's Certificate")
        certificate = tls.pull_certificate(buf)
        if certificate.request_context:
            raise tls.AlertIllegalParameter("certificate_request_context must be empty")
        if not certificate.certificates:
            raise _AlertCertificateRequired(
                "client presented no certificate; this server requires one"
            )
        self._process_certificate(certificate)
        try:
            der = self._peer_certificate.public_bytes()
            self._client = peer_id_of_certificate(x509.load_der_x509_certificate(der))
        except (TransportError, ValueError) as exc:
            raise tls.AlertBadCertificate(str(exc)) from None
        self.key_schedule.update_hash(buf.data)
        self._auth_step = "certificate_verify"

    def _client_certificate_verify(self, kind: int, buf: Buffer) -> None:
        if kind != tls.HandshakeType.CERTIFICATE_VERIFY:
            raise tls.AlertUnexpectedMessage("expected the client's CertificateVerify")
        verify = tls.pull_certificate_verify(buf)
        if verify.algorithm != tls.SignatureAlgorithm.ED25519:
            raise tls.AlertIllegalParameter("CertificateVerify must be Ed25519 (we asked for it)")
        client = self._client
        assert client is not None
        signed = self.key_schedule.certificate_verify_data(b"TLS 1.3, client CertificateVerify")
        try:
            Ed25519PublicKey.from_public_bytes(client.raw).verify(verify.signature, signed)
        except InvalidSignature:
            raise tls.AlertDecryptError(
                "client's CertificateVerify does not match its certificate's key"
            ) from None
        reason = self.authorize(client) if self.authorize is not None else None
        if reason is not None:
            raise _AlertAccessDenied(reason)
        self.key_schedule.update_hash(buf.data)
        self.peer_id = client
        # What qh3 anticipated without client authentication, over the right transcript.
        self._expected_verify_data = self.key_schedule.finished_verify_data(self._dec_key)
        finished = Buffer(capacity=64)
        tls.push_finished(finished, tls.Finished(verify_data=self._expected_verify_data))
        self.key_schedule.update_hash(finished.data)
        self._auth_step = "finished"


class _AuthQuic(QuicConnection):
    """qh3's connection whose TLS context is ``_ClientAuthContext``, and whose core leaves
    the anti-amplification limit to ``Qh3ServerConnection`` (see ``_create_core``)."""

    authorize: Authorize | None = None

    def _create_core(self, remote_addr, initial_dcid: bytes, now: float) -> None:
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

    def _create_tls(self, remote_source_cid: bytes | None):
        bridge = super()._create_tls(remote_source_cid)
        ctx = bridge.tls
        ctx.__class__ = _ClientAuthContext  # same object: only the server's handlers differ
        ctx._setup_auth(self.authorize)
        return bridge


class Qh3ServerConnection:
    """A qh3 server connection with the methods ``Connection`` and ``Endpoint`` call."""

    def __init__(
        self,
        configuration: QuicConfiguration,
        *,
        original_destination_connection_id: bytes,
        retry_source_connection_id: bytes | None,
        authorize: Authorize | None,
        unread_limit: int,
    ) -> None:
        quic = _AuthQuic(
            configuration=configuration,
            original_destination_connection_id=original_destination_connection_id,
            retry_source_connection_id=retry_source_connection_id,
        )
        quic.authorize = authorize  # read when the first Initial creates its TLS
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
        self._held: list[tuple[bytes, tuple]] = []  # over the 3x budget: sent when it allows
        self.app_consumed: dict[int, int] = {}
        self.app_buffered = 0
        self.frame_credit: dict[int, int] = {}
        self.frame_credit_total = 0

    # -- what aioquic's connection offers, delegated ------------------------------------------

    def receive_datagram(self, data: bytes, addr: tuple, now: float) -> None:
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

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, tuple]]:
        """qh3's datagrams (straight from its core: its Python wrapper only adds qlog
        bookkeeping); until the handshake completed (the client's address is then proven),
        at most three times the bytes received (RFC 9000 8.1): the rest waits for the
        client's next datagram (see ``_AuthQuic._create_core``)."""
        self._data_queued = False
        quic = self._quic
        core = quic._core
        real, now = now, max(now, self._clock)
        self._clock = now
        out: list[tuple[bytes, tuple]] = []
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
        if timer is None:
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
        self._quic.send_ping(uid)

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
            kind = type(e)
            if kind is qh3_events.StreamDataReceived:
                if self._over_limit(len(e.data)):
                    continue  # the connection is closed: the termination comes next
                return events.StreamDataReceived(e.data, e.end_stream, e.stream_id)
            if kind is qh3_events.ConnectionIdIssued:
                return events.ConnectionIdIssued(e.connection_id)
            if kind is qh3_events.ConnectionIdRetired:
                return events.ConnectionIdRetired(e.connection_id)
            if kind is qh3_events.StreamReset:
                return events.StreamReset(e.error_code, e.stream_id)
            if kind is qh3_events.StopSendingReceived:
                return events.StopSendingReceived(e.error_code, e.stream_id)
            if kind is qh3_events.ConnectionTerminated or (
                e is None and self._quic._close_event is not None
            ):
                if self._terminated:
                    if e is None:
                        return None
                    continue
                self._terminated = True
                closed = self._quic._close_event if e is None else e
                return events.ConnectionTerminated(
                    closed.error_code, closed.frame_type, closed.reason_phrase
                )
            if e is None:
                return None

    def _over_limit(self, arriving: int) -> bool:
        """Whether delivering ``arriving`` more bytes would pass the unread bound; if so the
        connection is closed (FLOW_CONTROL_ERROR) and the termination is the next event."""
        unread = self.app_buffered + arriving
        limit = self._unread_limit + self.frame_credit_total
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
    def peer_id(self) -> PeerId | None:
        ctx = self._quic.tls
        return getattr(ctx, "peer_id", None)

    @property
    def handshake_confirmed(self) -> bool:
        return self._quic._handshake_confirmed and self.peer_id is not None

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
    def _close_pending(self) -> bool:
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
        if not quic._handshake_confirmed or self._close_pending:
            return True
        if timer is not None and timer <= now:
            return True
        return quic._core is not None and quic.get_send_buffer_size() > 0

    def window_update_due(self, stream_id: int) -> bool:
        return False  # qh3's core grants credit as it delivers (module doc)

    def ack_now(self, now: float) -> None:
        pass  # qh3 acknowledges on its own timer (get_timer)


def qh3_server_configuration(identity: Identity, config: EndpointConfig, size: int):
    """qh3 settings for a server connection: our certificate, ALPN, windows, sizes."""
    configuration = QuicConfiguration(
        alpn_protocols=[ALPN],
        is_client=False,
        verify_mode=ssl.CERT_NONE,  # no CA: the client's key is checked, see the module
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
    authorize: Callable[[PeerId], str | None] | None,
) -> Qh3ServerConnection:
    """The qh3 connection a server answers a client's first Initial with."""
    return Qh3ServerConnection(
        qh3_server_configuration(identity, config, size),
        original_destination_connection_id=original_destination_connection_id,
        retry_source_connection_id=retry_source_connection_id,
        authorize=authorize,
        unread_limit=UNREAD_LIMIT_FACTOR * config.connection_window,
    )
