"""aioquic's sans-I/O connection as this project's engine: no sockets, no event loop.

``PeerQuicConnection`` is stock aioquic plus what the project needs of it, whatever its speed:

* the engine interface (``_engine``: back-pressure, what is due, the driver's ledger);
* **peer keys are not checked here**: each end proves its key above TLS (``_auth``), with
  nothing of aioquic but its public ``secrets_log_file``; the peer may open one
  unidirectional stream, the one its proof comes on;
* **flow-control windows follow the reader.** Stock aioquic doubles a receive window once
  half of it has *arrived*, whether or not the application read anything, so a peer can make
  it buffer without bound. Here the window is what the application consumed plus a fixed
  allowance, and MAX_STREAMS stays at the configured number of concurrent streams.

Its performance overrides are ``_quic_fast``'s, put in front of it when their conformance
check passed (``AioquicConnection``, what the factories here make); in stock mode they are
left out and datagrams stay at ``STOCK_DATAGRAM_SIZE`` at most.
"""

from __future__ import annotations

import io

from aioquic import tls
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.packet import QuicFrameType
from aioquic.quic.packet_builder import QuicPacketBuilder
from aioquic.quic.recovery import QuicPacketSpace
from aioquic.quic.stream import QuicStream

from . import _quic_fast
from ._config import DEFAULT_DATAGRAM_SIZE, JUMBO_THRESHOLD, EndpointConfig, quic_configuration
from ._engine import ReceiveLedger
from ._identity import Identity

AUTH_UNI_STREAMS = 1
"""Unidirectional streams a peer may open: the one its key proof comes on (``_auth``)."""

_VARINT_MAX = 8


class PeerQuicConnection(QuicConnection):
    """A ``QuicConnection`` that authenticates peers by key and bounds its receive buffers.

    The driver's ``ledger`` (``_engine.ReceiveLedger``: what the application has read,
    what was delivered and not read, the frames readers wait for) is read when packets are
    built, to derive the windows advertised to the peer. The credit lets a frame larger
    than the window arrive whole while someone is reading it: the bound on buffered bytes is
    ``connection_window`` plus one frame per stream being read.
    """

    def __init__(
        self,
        *,
        configuration: QuicConfiguration,
        max_streams: int = 128,
        ledger: ReceiveLedger | None = None,
        original_destination_connection_id: bytes | None = None,
        retry_source_connection_id: bytes | None = None,
        max_packets_in_flight: int | None = None,
        path_datagram_size: int | None = None,
    ) -> None:
        del max_packets_in_flight, path_datagram_size  # (``_quic_fast``'s; stock has no use)
        super().__init__(
            configuration=configuration,
            original_destination_connection_id=original_destination_connection_id,
            retry_source_connection_id=retry_source_connection_id,
        )
        self._stream_window = configuration.max_stream_data
        self._connection_window = configuration.max_data
        self._local_max_streams_bidi.value = self._local_max_streams_bidi.sent = max_streams
        self._local_max_streams_uni.value = self._local_max_streams_uni.sent = AUTH_UNI_STREAMS
        self._data_queued = False  # stream data written since the last build
        self.ledger = ledger or ReceiveLedger()

    def send_stream_data(self, stream_id: int, data: bytes, end_stream: bool = False) -> None:
        """aioquic's; remembers that a build is due (``data_queued``)."""
        super().send_stream_data(stream_id, data, end_stream)
        self._data_queued = True

    def ack_now(self, now: float) -> None:
        """Stock aioquic acknowledges on its own timer (``_quic_fast`` holds ACKs longer)."""

    @property
    def close_pending(self) -> bool:
        """A close was asked for and its CONNECTION_CLOSE is not sent yet."""
        return self._close_pending

    @property
    def is_client(self) -> bool:
        return self._is_client

    @property
    def data_queued(self) -> bool:
        """Whether stream data was written since the last build (it is due now)."""
        return self._data_queued

    @property
    def handshake_confirmed(self) -> bool:
        """True once both sides accepted each other (client: HANDSHAKE_DONE received)."""
        return self._handshake_confirmed

    @property
    def first_flight_accepted(self) -> bool:
        """Server side: whether a received Initial decrypted (a garbage one leaves no trace)."""
        space = self._spaces.get(tls.Epoch.INITIAL)
        return space is not None and len(space.ack_queue) > 0

    def open_bidi_stream(self) -> int:
        """Allocate the next local bidirectional stream id now, so that two streams opened
        before either sends cannot get the same id (aioquic only advances it on send)."""
        stream_id = self.get_next_available_stream_id()
        self._get_or_create_stream_for_send(stream_id)
        return stream_id

    def sender_buffered(self, stream_id: int) -> int:
        """Bytes written to a stream and not yet acknowledged by the peer."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.sender._reset_error_code is not None:
            return 0  # reset (the peer sent STOP_SENDING): a writer must not wait on it
        return stream.sender._buffer_stop - stream.sender._buffer_start

    def finish_stream(self, stream_id: int) -> None:
        """Send our FIN on a stream unless we already did (aioquic keeps a stream's state
        until both directions are finished)."""
        stream = self._streams.get(stream_id)
        if stream is not None and stream.sender._buffer_fin is None:
            self.send_stream_data(stream_id, b"", end_stream=True)

    def send_due(self, now: float) -> bool:
        """Whether received datagrams call for building one now.

        Building nothing costs ~20 us in aioquic, and after most received datagrams (a
        reply, an ACK) there is nothing to build: the ACK they are owed waits for its delay.
        Due now: anything during the handshake or a close, a timer that expired (an ACK,
        a retransmission), stream data waiting (an ACK may have opened the congestion
        window, or declared a packet lost). Frames that answer a peer's request (a
        PATH_RESPONSE, new connection ids) arrive in ack-eliciting packets, so they leave
        with that ACK, at most ``ACK_DELAY`` later. Window updates are the driver's to check
        (``window_update_due``), as it consumes data."""
        return self.send_due_at(now, self.get_timer())

    def send_due_at(self, now: float, timer: float | None) -> bool:
        """``send_due`` for a caller that just read ``get_timer()`` (it is not free)."""
        if not self._handshake_confirmed or self._close_pending or self._handshake_done_pending:
            return True
        if timer is not None and timer <= now:
            return True
        return any(not s.sender.buffer_is_empty for s in self._streams.values())

    def unacknowledged(self) -> bool:
        """Whether any stream holds data the peer has not acknowledged yet."""
        return any(self.sender_buffered(sid) for sid in self._streams)

    def window_update_due(self, stream_id: int) -> bool:
        """Whether reads since the last MAX_STREAM_DATA/MAX_DATA justify sending an update."""
        ledger = self.ledger
        stream = self._streams.get(stream_id)
        quarter_s = self._stream_window // 4
        if stream is not None and stream.max_stream_data_local:
            target = (
                ledger.consumed.get(stream_id, 0)
                + self._stream_window
                + ledger.frame_credit.get(stream_id, 0)
            )
            if target - stream.max_stream_data_local >= quarter_s:
                return True
        limit = self._local_max_data
        target = limit.used - ledger.buffered + self._connection_window + ledger.frame_credit_total
        return target - limit.value >= self._connection_window // 4

    # -- overrides -------------------------------------------------------------------------

    def _write_connection_limits(self, builder: QuicPacketBuilder, space: QuicPacketSpace) -> None:
        max_data = self._local_max_data
        target = (
            max_data.used
            - self.ledger.buffered
            + self._connection_window
            + self.ledger.frame_credit_total
        )
        if target - max_data.value >= self._connection_window // 4:
            max_data.value = target
        for limit in (max_data, self._local_max_streams_bidi, self._local_max_streams_uni):
            if limit is not max_data and limit.sent - limit.used >= limit.value - limit.sent:
                continue  # batch MAX_STREAMS until the grant is worth a frame
            if limit.value != limit.sent:
                buf = builder.start_frame(
                    limit.frame_type,
                    capacity=1 + _VARINT_MAX,
                    handler=self._on_connection_limit_delivery,
                    handler_args=(limit,),
                )
                buf.push_uint_var(limit.value)
                limit.sent = limit.value

    def _write_stream_limits(
        self, builder: QuicPacketBuilder, space: QuicPacketSpace, stream: QuicStream
    ) -> None:
        sid = stream.stream_id  # (None only for a crypto stream, which has no limits)
        if sid is None or not stream.max_stream_data_local or stream.receiver.is_finished:
            return
        ledger = self.ledger
        target = ledger.consumed.get(sid, 0) + self._stream_window + ledger.frame_credit.get(sid, 0)
        if target - stream.max_stream_data_local >= self._stream_window // 4:
            stream.max_stream_data_local = target
        if stream.max_stream_data_local_sent != stream.max_stream_data_local:
            buf = builder.start_frame(
                QuicFrameType.MAX_STREAM_DATA,
                capacity=1 + 2 * _VARINT_MAX,
                handler=self._on_max_stream_data_delivery,
                handler_args=(stream,),
            )
            buf.push_uint_var(sid)
            buf.push_uint_var(stream.max_stream_data_local)
            stream.max_stream_data_local_sent = stream.max_stream_data_local


class _FastPeerQuicConnection(_quic_fast.FastPaths, PeerQuicConnection):
    """``PeerQuicConnection`` with ``_quic_fast``'s performance overrides."""


AioquicConnection: type[PeerQuicConnection] = (
    _FastPeerQuicConnection if _quic_fast.FAST else PeerQuicConnection
)
"""The aioquic connection class the factories make: with the overrides unless stock mode."""


def handshake_datagram_size(size: int) -> int:
    """The datagram size a connection starts at, for a path of ``size``: with the overrides,
    a jumbo path handshakes at ``DEFAULT_DATAGRAM_SIZE`` (aioquic pads Initials to the full
    size) and rises after; stock aioquic keeps its first size, at most ``STOCK_DATAGRAM_SIZE``
    (its STREAM lengths are 2-byte varints)."""
    if AioquicConnection is PeerQuicConnection:
        return min(size, _quic_fast.STOCK_DATAGRAM_SIZE)
    return DEFAULT_DATAGRAM_SIZE if size > JUMBO_THRESHOLD else size


def aioquic_connection(
    identity: Identity,
    config: EndpointConfig,
    size: int,
    secrets: io.TextIOBase,
    ledger: ReceiveLedger | None,
    *,
    is_client: bool,
    original_destination_connection_id: bytes | None = None,
    retry_source_connection_id: bytes | None = None,
) -> PeerQuicConnection:
    """An aioquic connection of either side, on a path of datagram size ``size``."""
    return AioquicConnection(
        configuration=quic_configuration(
            identity,
            is_client=is_client,
            config=config,
            datagram_size=handshake_datagram_size(size),
            secrets=secrets,
        ),
        path_datagram_size=size,
        max_streams=config.max_streams,
        max_packets_in_flight=config.max_packets_in_flight,
        ledger=ledger,
        original_destination_connection_id=original_destination_connection_id,
        retry_source_connection_id=retry_source_connection_id,
    )


def client_connection(
    identity: Identity,
    config: EndpointConfig,
    host: str,
    secrets: io.TextIOBase,
    ledger: ReceiveLedger | None = None,
) -> PeerQuicConnection:
    """The sans-I/O connection a client dials ``host`` with (both shells); ``secrets``
    receives the TLS key log the key proofs are bound to (``_auth.SecretSink``), ``ledger``
    is the driver's (``_engine``)."""
    return aioquic_connection(
        identity, config, config.datagram_size_for(host), secrets, ledger, is_client=True
    )
