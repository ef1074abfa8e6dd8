"""The client connection on qh3 (an aioquic fork whose QUIC core is compiled): optional.

Why: per datagram, aioquic's Python costs a client ~100-200 us of CPU on a small machine;
qh3 does the same work in native code. This is the client side; a server on qh3 (which must
also ask for and check the client's certificate, something qh3 2.x's TLS server never does)
is ``_qh3_server``. Either engine talks to either on the wire.

``Qh3ClientConnection`` offers what ``BlockingConnection`` uses of ``PeerQuicConnection``,
translated to qh3's public API:

* keys are proven above TLS by the driver (``_auth``); this adapter only hands qh3 the
  key-log sink (its public ``secrets_log_file``) and reports the handshake's ALPN;
* flow-control windows and datagram sizes are qh3's own (its core grants credit as data is
  delivered; the reader thread consumes everything at once anyway), except the
  max_udp_payload_size it advertises (``MAX_UDP_PAYLOAD``); ACKs wait as in ``_quic``
  (``get_timer``);
* an idle pacing timer waits like an ACK: on a fresh loopback connection qh3's pacer
  spaces packets ~0.5 ms apart whatever their size (its congestion window starts at two
  64 KB datagrams and its RTT estimate never drops below 1 ms), so the ACK-only datagram
  qh3 sends after every second reply made the next request wait for the pacer;
* send back-pressure counts what qh3 has queued for a stream plus what is in flight.
"""

from __future__ import annotations

import io
import ssl

from aioquic.quic import events
from cryptography.hazmat.primitives import serialization
from qh3._hazmat import Buffer, encode_uint_var
from qh3.quic import events as qh3_events
from qh3.quic.configuration import QuicConfiguration
from qh3.quic.connection import QuicConnection, QuicConnectionError
from qh3.quic.tls_bridge import QuicTlsBridge
from qh3.tls import ExtensionType, SignatureAlgorithm

from ..addressing import SocketAddress
from ._config import ALPN, EndpointConfig
from ._engine import ReceiveLedger
from ._errors import TransportError
from ._identity import Identity
from ._quic_fast import ACK_DELAY, ACK_EVERY_BYTES

BULK_DATAGRAM = 1200
"""Bytes from which a received datagram is bulk data (a tensor read), not a reply: QUIC's
smallest full datagram. Its ACK keeps qh3's own timing (within ~1 ms, at once on a gap), as
``_quic_fast.BULK_ACK_DELAY`` does for aioquic: held ``ACK_DELAY``, a sender whose window held
less than ``ACK_EVERY_BYTES`` waited 20 ms per window (slow start, after every loss). A fixed
floor, not half our own datagram size as ``_quic`` judges "full": a qh3 server's datagrams
may be far smaller than ours (``MAX_UDP_PAYLOAD``; ~1.2 KB after losses)."""

SIGNATURE_ALGORITHMS = [
    SignatureAlgorithm.ED25519,
    SignatureAlgorithm.ECDSA_SECP256R1_SHA256,
    SignatureAlgorithm.RSA_PSS_RSAE_SHA256,
]
"""What the client accepts in the server's CertificateVerify: Ed25519 first (every peer
signs with its Ed25519 identity; qh3 leaves it out unless asked)."""


MAX_UDP_PAYLOAD = 32768
"""The largest datagram a qh3 client asks its server for (max_udp_payload_size; its own
datagram size where smaller). qh3's client says 1472 whatever its size, and a qh3 server
honours it: a 256 MiB read came in 1443-byte datagrams at ~110 MB/s (~650 at this size).
Not 65000: qh3's server charges every packet a whole maximum datagram of its pacer and
congestion window, and at 65000 an item() round trip on a warm qh3 pair took ~230 us
instead of ~145-170 (bench/transport.py's bench_item_servers)."""

_MAX_UDP_PAYLOAD_SIZE = 0x03
"""The transport parameter max_udp_payload_size (RFC 9000 18.2)."""


def with_max_udp_payload_size(encoded: bytes, size: int) -> bytes:
    """Encoded transport parameters with max_udp_payload_size set to ``size``; every other
    parameter (grease included) is kept, byte for byte and in its order."""
    buf = Buffer(data=encoded)
    out = bytearray()
    while not buf.eof():
        param_id = buf.pull_uint_var()
        value = buf.pull_bytes(buf.pull_uint_var())
        if param_id != _MAX_UDP_PAYLOAD_SIZE:
            out += encode_uint_var(param_id) + encode_uint_var(len(value)) + value
    sized = encode_uint_var(size)
    out += encode_uint_var(_MAX_UDP_PAYLOAD_SIZE) + encode_uint_var(len(sized)) + sized
    return bytes(out)


class _SizedBridge(QuicTlsBridge):
    """qh3's client TLS bridge, advertising the datagram size the client was configured for
    (up to ``MAX_UDP_PAYLOAD``): qh3's client always says max_udp_payload_size = 1472, and a
    qh3 server (which honours it) then sent every tensor read in ~1440-byte datagrams even
    on loopback, where our clients receive 65000 (``LOOPBACK_DATAGRAM_SIZE``). An aioquic
    server moves to its path's size after the handshake either way."""

    def serialize_transport_parameters(self) -> bytes:
        encoded = super().serialize_transport_parameters()
        size = min(self.configuration.max_datagram_size, MAX_UDP_PAYLOAD)
        return with_max_udp_payload_size(encoded, size)


class _SizedQuic(QuicConnection):
    """qh3's client connection with ``_SizedBridge`` as its TLS bridge."""

    def _create_tls(self, remote_source_cid: bytes | None) -> QuicTlsBridge:
        bridge = super()._create_tls(remote_source_cid)
        bridge.__class__ = _SizedBridge  # same object; its parameters were encoded already
        bridge.tls.handshake_extensions = [
            (ExtensionType.QUIC_TRANSPORT_PARAMETERS, bridge.serialize_transport_parameters())
        ]
        return bridge


class Qh3ClientConnection:
    """A qh3 client connection with the methods ``BlockingConnection`` calls."""

    def __init__(
        self,
        identity: Identity,
        config: EndpointConfig,
        size: int,
        secrets: io.TextIOBase,
        ledger: ReceiveLedger | None = None,
    ):
        cert = identity.certificate().public_bytes(serialization.Encoding.PEM)
        key = identity.private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        configuration = QuicConfiguration(
            alpn_protocols=[ALPN],
            is_client=True,
            verify_mode=ssl.CERT_NONE,  # no CA: keys are proven above TLS (``_auth``)
            idle_timeout=config.idle_timeout,
            max_data=config.connection_window,
            max_stream_data=config.stream_window,
            max_datagram_size=size,
            signature_algorithms=list(SIGNATURE_ALGORITHMS),
            # (the stub asks for typing.TextIO; the key log only calls write() and flush())
            secrets_log_file=secrets,  # type: ignore[arg-type]
        )
        configuration.load_cert_chain(cert, key)
        self._quic = _SizedQuic(configuration=configuration)
        self._finished: set[int] = set()
        self._failed: events.ConnectionTerminated | None = None
        self._now = 0.0  # when the last datagram arrived
        self._ack_since: float | None = None  # when qh3's ACK timer was first seen armed
        self._unacked_bytes = 0  # received since we last sent a datagram
        self._bulk_in = False  # the last datagram received was bulk data
        self.ledger = ledger or ReceiveLedger()  # the driver's; qh3 grants credit by itself

    # -- what aioquic's connection offers, delegated ------------------------------------------

    def connect(self, addr: SocketAddress, now: float) -> None:
        self._quic.connect(addr, now=now)

    def receive_datagram(self, data: bytes, addr: SocketAddress, now: float) -> None:
        self._now = now
        self._unacked_bytes += len(data)
        self._bulk_in = len(data) >= BULK_DATAGRAM
        self._quic.receive_datagram(data, addr, now)

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, SocketAddress]]:
        out = self._quic.datagrams_to_send(now)
        if out:
            self._unacked_bytes = 0  # what we owed left with them
        return out

    def get_timer(self) -> float | None:
        """qh3's timer, except that an ACK may wait ``ACK_DELAY`` from when it became
        pending, or until ``ACK_EVERY_BYTES`` or a ``BULK_DATAGRAM`` arrived (qh3 sends one
        within about a millisecond, or at once for every second packet: in request/reply
        traffic that is a datagram of its own, which costs the server a receive in Python,
        instead of a ride on the next request).

        A pacing timer while no stream data waits (qh3 paces ACKs and window updates
        too) is such an ACK timer: the ACK-only datagram it would send costs a paced slot,
        and on a fresh connection the pacer's slot (the largest datagram over the window
        over at least 1 ms, ~0.5 ms on loopback) is longer than a round trip, so the next
        request waited for it: ~1.2 datagrams and twice the time per ``item()``. Paced
        stream data, and everything before the handshake is confirmed, keep qh3's timer."""
        quic = self._quic
        core = quic._core
        timer = None if core is None else core.get_timer()
        if core is None or timer is None:
            self._ack_since = None
            return None
        kind, at = timer
        if kind != "ack_application" and (
            kind != "pacing" or not quic._handshake_confirmed or core.get_send_buffer_size() > 0
        ):
            self._ack_since = None
            return at
        if self._unacked_bytes >= ACK_EVERY_BYTES or self._bulk_in:
            return at
        if self._ack_since is None:
            self._ack_since = self._now
        return max(at, self._ack_since + ACK_DELAY)

    def ack_now(self, now: float) -> None:
        """The ACK qh3 owes goes on its own timer, not held ``ACK_DELAY`` (``_quic``)."""
        self._ack_since = now - ACK_DELAY

    def handle_timer(self, now: float) -> None:
        self._quic.handle_timer(now)

    def send_stream_data(self, stream_id: int, data: bytes, end_stream: bool = False) -> None:
        """Raises TransportError when qh3's core has closed (the peer's CONNECTION_CLOSE came
        before the driver's reader saw it): the error every engine raises there, which a
        best-effort sender (a goodbye at exit) expects, not qh3's own exception."""
        try:
            self._quic.send_stream_data(stream_id, data, end_stream)
        except QuicConnectionError as exc:
            raise TransportError(f"connection closed: {exc.reason_phrase}") from None
        if end_stream:
            self._finished.add(stream_id)

    def send_ping(self, uid: int) -> None:
        """A PING; none on a connection qh3 has closed already (as ``Qh3ServerConnection``:
        qh3 raises there, aioquic does not)."""
        try:
            self._quic.send_ping(uid)
        except (QuicConnectionError, RuntimeError):
            pass  # the close reaches the driver as its event

    def stop_stream(self, stream_id: int, error_code: int) -> None:
        self._quic.stop_stream(stream_id, error_code)

    def close(self, error_code: int = 0, reason_phrase: str = "") -> None:
        self._quic.close(error_code=error_code, reason_phrase=reason_phrase)

    def next_event(self) -> events.QuicEvent | None:
        """qh3's next event as aioquic's event class (the driver speaks aioquic's)."""
        if self._failed is not None:
            failed, self._failed = self._failed, None
            return failed
        e = self._quic.next_event()
        if isinstance(e, qh3_events.StreamDataReceived):
            return events.StreamDataReceived(e.data, e.end_stream, e.stream_id)
        if isinstance(e, qh3_events.HandshakeCompleted):
            return events.HandshakeCompleted(e.alpn_protocol, False, False)
        if isinstance(e, qh3_events.StreamReset):
            return events.StreamReset(e.error_code, e.stream_id)
        if isinstance(e, qh3_events.StopSendingReceived):
            return events.StopSendingReceived(e.error_code, e.stream_id)
        if isinstance(e, qh3_events.ConnectionTerminated):
            return events.ConnectionTerminated(e.error_code, e.frame_type, e.reason_phrase)
        if e is None:
            return None
        return self.next_event()  # nothing the driver acts on

    # -- what PeerQuicConnection adds ---------------------------------------------------------

    @property
    def handshake_confirmed(self) -> bool:
        return self._quic._handshake_confirmed

    @property
    def close_pending(self) -> bool:
        return False  # qh3 sends its CONNECTION_CLOSE from the next build, which close() asks for

    def open_bidi_stream(self) -> int:
        return self._quic._open_stream()

    def finish_stream(self, stream_id: int) -> None:
        if stream_id not in self._finished:
            self.send_stream_data(stream_id, b"", end_stream=True)

    def sender_buffered(self, stream_id: int) -> int:
        """Bytes of this stream qh3 has not sent yet, plus everything in flight (qh3 does not
        say per stream what awaits an acknowledgement)."""
        quic = self._quic
        if quic._core is None:
            return 0
        return quic.get_send_buffer_size(stream_id) + quic._core.bytes_in_flight

    def unacknowledged(self) -> bool:
        quic = self._quic
        return quic._core is not None and (
            quic.get_send_buffer_size() > 0 or quic._core.bytes_in_flight > 0
        )

    def send_due_at(self, now: float, timer: float | None) -> bool:
        """A due timer (an ACK whose delay expired, a retransmission) or data queued: an
        ACK is not sent for every datagram received (each would cost the server a receive
        in Python)."""
        if not self._quic._handshake_confirmed or (timer is not None and timer <= now):
            return True
        return self._quic.get_send_buffer_size() > 0

    def window_update_due(self, stream_id: int) -> bool:
        return False  # qh3's core sends its window updates from the next build


def qh3_client_connection(
    identity: Identity,
    config: EndpointConfig,
    host: str,
    secrets: io.TextIOBase,
    ledger: ReceiveLedger | None = None,
) -> Qh3ClientConnection:
    """The qh3 connection a client dials ``host`` with; ``secrets`` gets its TLS key log."""
    size = config.datagram_size_for(host)
    return Qh3ClientConnection(identity, config, size, secrets, ledger)
