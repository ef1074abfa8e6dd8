"""aioquic's performance overrides, in one module, each with its measured gain.

Everything here is speed: ``_quic.PeerQuicConnection`` (stock aioquic plus what this
project needs of it: windows that follow the reader, the engine interface) works without
it, at stock aioquic's speed. These overrides use aioquic's private surface, so at import a
conformance check (``surface_problems``) looks for every private name they use, with the
signature they override or call; on any mismatch (a new aioquic release) it warns and the
package runs stock aioquic (``FAST`` is False, ``STOCK_REASON`` says why), as it does when
``BURN_REMOTE_AIOQUIC_STOCK=1`` asks for it. In stock mode, datagrams are at most
``STOCK_DATAGRAM_SIZE`` (stock aioquic writes STREAM lengths on 2 bytes, below).

* **STREAM frames may exceed 16 KiB, so loopback datagrams are 64 KiB.** aioquic writes a STREAM frame's length as a 2-byte
  varint, so a frame longer than 16383 bytes is corrupt; with 64 KiB loopback datagrams the
  length is written as a 4-byte varint instead (RFC 9000 varints allow either). Gain
  (bench/transport.py, 256 MiB upload, loopback): 575-785 MB/s at 65000-byte datagrams
  against 40-46 MB/s at 1452 (stock mode's 16000: about 200-300 MB/s). The handshake runs
  at 1350 bytes and the size rises once it is confirmed (``_use_datagram_size``): aioquic
  pads every Initial to the full size, and 64 KiB tripled the handshake time.
* **The congestion window is capped** at ``max_packets_in_flight`` datagrams: aioquic's
  per-packet bookkeeping on a window of thousands of small packets cost more than the window
  gained (1452-byte datagrams on loopback: ~25 -> ~50 MB/s).
* **ACKs are delayed, but not for long bursts, and ride on data.** aioquic acknowledges
  every ack-eliciting packet within 1 ms, so a client sending a training step a millisecond
  got an ACK per step: a packet built, encrypted, sent, received and processed in Python on
  both ends. Here an ACK waits up to ``ACK_DELAY`` (under the 25 ms ``max_ack_delay`` we
  advertise), or goes out at once after ``ACK_EVERY_BYTES`` or ``ACK_EVERY_DATAGRAMS`` full
  datagrams, which keeps bulk transfers clocked (RFC 9000 13.2.2 suggests every second
  packet; for 64 KiB datagrams at hundreds of MB/s that is an ACK per 128 KiB, more ACK work
  than data work in Python). Bulk data (a full datagram) is acknowledged within
  ``BULK_ACK_DELAY``, and a datagram that opens or fills a gap in the packet numbers at once
  (RFC 9000 13.2.1), so a sender with a small congestion window (slow start, after a loss)
  is not held ``ACK_DELAY`` per window. And a packet
  that carries stream data carries the pending ACK too (RFC 9000 13.2.1 allows it; aioquic
  only writes an ACK once its delay expired): in request/reply traffic every ACK rides on a
  request or a reply, and no datagram carries an ACK alone. A server's ACK rides on every
  reply: a qh3 client holds its next request back while its last one is unacknowledged
  (measured: a server acknowledging every 10 ms or every second request made each
  ``item()`` wait ~20 ms for the ``ACK_DELAY`` timer). A client's ACK rides only once it has
  waited ``ACK_RIDE_AFTER`` (or ``CLIENT_ACK_RIDE_PACKETS`` datagrams): its peer is always a
  server of ours on aioquic, which does not wait for ACKs within its congestion window, and
  processing an ACK (loss detection, RTT, congestion control) cost the server ~20 us of
  Python per request, more than a small request itself; in an ``item()`` loop the server
  now processes one ACK per ~20 requests. It also rides when the client sent no ACK for
  ``ACK_DELAY``: traffic that sparse sends no request before the ACK's timer, so the ACK
  would go alone. A remote ``generate`` reads its tokens every ~1-2 s and queues the next
  read a millisecond after a reply: the reply's ACK rides on it instead of costing the
  client a timer wake-up and a datagram of its own (~0.8 ms of client CPU per read on a
  busy 2-core host).
* **A build ends with the packet that left nothing behind.** aioquic's ``_write_application``
  starts another 1-RTT packet after every non-empty one and discards it when it stays empty,
  so each small request or reply cost two packets' worth of builder work (~8 us of Python
  on each end of every round trip). Before each further packet aioquic asks the pacer
  when it may send; ``_BuildPacer`` ends the build there when the last packet's STREAM
  frames left no data behind (``_nothing_left``: every other writer either writes all it
  has or stops the build), no stream was discarded (that may owe MAX_STREAMS) and no
  CRYPTO data waits. A STREAM frame that empties its stream marks it empty at once (what
  aioquic's next, now skipped, ``get_frame`` would have found), so ``send_due`` stays exact.
* **Packet data is copied less.** aioquic copied a 1-RTT packet's stream data
  twice out of the stream's buffer (``get_frame`` slices a bytearray, then makes bytes of
  the slice), the packet out of its builder's buffer and its payload out of that copy, the
  ciphertext three times in header protection (header + payload, a bytearray of that,
  bytes of that), back into the builder's buffer, and the datagram out of it again: ten
  copies of a 64 KiB packet between the stream's buffer and the socket, besides encrypting
  it. Here it is four (``_take_frame``, ``_OneCopyBuilder``, ``_OneCopySend``), with the
  same bytes on the wire. A captured training step uploads its batch every step: a client
  sends a few such packets per read; a server sends them when a client reads a big tensor
  (a 256 MiB read: 6-11 % less server CPU).
"""

from __future__ import annotations

import inspect
import logging
import os
import weakref
from typing import TYPE_CHECKING, Required, TypedDict, Unpack, cast

from aioquic import tls
from aioquic.buffer import size_uint_var
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.congestion.base import create_congestion_control
from aioquic.quic.connection import QuicConnection, QuicNetworkPath
from aioquic.quic.crypto import CryptoContext, HeaderProtection
from aioquic.quic.packet import (
    PACKET_FIXED_BIT,
    PACKET_NUMBER_MAX_SIZE,
    QuicFrameType,
    QuicPacketType,
    QuicStreamFrame,
)
from aioquic.quic.packet_builder import (
    PACKET_NUMBER_SEND_SIZE,
    QuicPacketBuilder,
    QuicPacketBuilderStop,
)
from aioquic.quic.recovery import QuicPacketPacer, QuicPacketSpace
from aioquic.quic.stream import QuicStream, QuicStreamSender

from ..addressing import SocketAddress
from ._engine import ReceiveLedger

if TYPE_CHECKING:  # the mixin goes in front of PeerQuicConnection: checked as its subclass
    from ._quic import PeerQuicConnection as _MixedInto
else:
    _MixedInto = object

log = logging.getLogger("burn_remote.transport")

STOCK_ENV = "BURN_REMOTE_AIOQUIC_STOCK"
"""Set to 1 to run stock aioquic (no override of this module), whatever the check says."""
STOCK_DATAGRAM_SIZE = 16000
"""The largest datagram in stock mode: stock aioquic writes a STREAM frame's length as a
2-byte varint (at most 16383), so a larger packet would carry corrupt frames."""

ACK_DELAY = 0.020
"""Seconds an ack-eliciting packet may wait for its ACK (aioquic's default is 1 ms). Below
the 25 ms ``max_ack_delay`` both ends advertise (the peer's loss timer allows for it), and
longer than a training loop's gap between reads (ten steps), so the ACK a reply is owed
rides on the next request instead of a datagram of its own."""
ACK_RIDE_AFTER = 0.010
"""Seconds a client's owed ACK waits before it rides on its next stream data (see the module
doc): half of ``ACK_DELAY``, so that in a steady exchange it leaves with a request, not
alone on the ``ACK_DELAY`` timer."""
CLIENT_ACK_RIDE_PACKETS = 32
"""Datagrams received while a client owes an ACK after which it rides on the next request
regardless of its age. A server rides its ACK on every reply (a qh3 client waits for it).
An aioquic server keeps sending without ACKs within its congestion window, and processing
an ACK costs it ~10-20 us of Python per request, so here a client's ACK rides rarely. A qh3
server (``serve --quic-engine qh3``) paces its replies by the ACKs it gets: an aioquic
client's ``item()`` on it measured ~300-450 us with 32 here, 230-270 us with 1 (riding costs
a qh3 server nothing, an aioquic server ~10 us per request); the client cannot tell the
server's engine, so a qh3 client is the one to pair with a qh3 server."""
ACK_EVERY_BYTES = 256 * 1024
"""Bytes received without an ACK after which one is sent at once."""
ACK_EVERY_DATAGRAMS = 10
"""Full datagrams received without an ACK after which one is sent at once, where that is
fewer bytes than ``ACK_EVERY_BYTES`` (ACK decimation as Chromium's QUIC does it: every tenth
packet). At a real network's datagram size ``ACK_EVERY_BYTES`` alone is ~190 packets."""


def _ack_every_bytes(datagram_size: int) -> int:
    """Bytes received after which an ACK is due at once, at this datagram size (kept with
    the size: it changes once, after the handshake, and is read per datagram received)."""
    return min(ACK_EVERY_BYTES, ACK_EVERY_DATAGRAMS * datagram_size)


BULK_ACK_DELAY = 0.001
"""Seconds the ACK of a full datagram (at least half the datagram size: bulk data, not a
request or a reply) may wait: aioquic's own delay. With ``ACK_DELAY`` a sender whose
congestion window held fewer than ``ACK_EVERY_DATAGRAMS`` datagrams (slow start, after a
loss) sent its window, then waited 20 ms for the ACK: 4 MiB each way through 1 % loss at
1350-byte datagrams took ~9 s, through 10 % loss ~40 s."""


class _BuildPacer(QuicPacketPacer):
    """aioquic's pacer, which ``_write_application`` consults before each 1-RTT packet; after a
    packet that left nothing behind it also ends the build (``PeerQuicConnection``'s doc)."""

    owner: weakref.ref[FastPaths]
    after_packet: bool

    def update_after_send(self, now: float) -> None:
        self.after_packet = True
        super().update_after_send(now)

    # (aioquic annotates ``float`` but returns None when no packet need wait, as this does)
    def next_send_time(self, now: float) -> float | None:  # type: ignore[override]
        if self.after_packet:
            self.after_packet = False
            conn = self.owner()
            if conn is not None and conn._nothing_left():
                raise QuicPacketBuilderStop  # datagrams_to_send ends the build here
        return super().next_send_time(now)


class _OneCopySend(CryptoContext):
    """aioquic's send keys, protecting a packet with one copy of its ciphertext: the header
    alone is masked, then joined to the ciphertext (aioquic's ``HeaderProtection.apply``
    copies the whole packet three times). The same bytes as aioquic's ``encrypt_packet``."""

    def encrypt_packet(
        self, plain_header: bytes, plain_payload: bytes, packet_number: int
    ) -> bytes:
        aead, hp = self.aead, self.hp
        if aead is None or hp is None:  # (set up before any packet is protected)
            raise RuntimeError("packet protection used before its keys were set up")
        protected = aead.encrypt(plain_payload, plain_header, packet_number)
        pn_length = (plain_header[0] & 0x03) + 1
        sample = _PN_MAX - pn_length  # where the 16-byte sample starts (RFC 9001 5.4.2)
        mask = hp._mask(protected[sample : sample + _SAMPLE])
        header = bytearray(plain_header)
        header[0] ^= mask[0] & (0x0F if header[0] & 0x80 else 0x1F)
        at = len(header) - pn_length
        for i in range(pn_length):
            header[at + i] ^= mask[1 + i]
        return bytes(header) + protected


_PN_MAX = PACKET_NUMBER_MAX_SIZE
"""Header protection samples as if the packet number were this long (RFC 9001 5.4.2)."""
_SAMPLE = 16
"""Bytes of ciphertext header protection samples."""


def _take_frame(
    sender: QuicStreamSender, max_size: int, max_offset: int | None
) -> QuicStreamFrame | None:
    """``sender.get_frame(max_size, max_offset)`` with the data copied once out of the
    stream's buffer instead of twice (same frame, same sender state afterwards); the cases
    without data to send (a FIN alone, nothing pending, no room) are aioquic's own."""
    pending = sender._pending
    if max_size < 0 or not len(pending) or sender._reset_error_code is not None:
        return sender.get_frame(max_size, max_offset)
    r = pending[0]
    start = r.start
    stop = min(r.stop, start + max_size)
    if max_offset is not None and stop > max_offset:
        stop = max_offset
    if stop <= start:
        return None
    base = sender._buffer_start
    with memoryview(sender._buffer) as view:  # (released at once: the buffer may grow)
        frame = QuicStreamFrame(data=bytes(view[start - base : stop - base]), offset=start)
    pending.subtract(start, stop)
    if stop > sender.highest_offset:
        sender.highest_offset = stop
    if sender._buffer_fin == stop:
        frame.fin = True
        sender._pending_eof = False
    return frame


class _OneCopyBuilder(QuicPacketBuilder):
    """aioquic's packet builder, except that a 1-RTT packet alone in its datagram (neither
    end sends another kind after the handshake) is encrypted from one copy of the builder's
    buffer, its payload read through a view, into the datagram it leaves in: aioquic also
    copies the payload out of that copy, the protected packet back into the buffer and the
    datagram out of the buffer. Anything else (a packet after another in one datagram,
    padding, a qlog) is aioquic's own ``_end_packet``. The same datagrams and packet records."""

    def _end_packet(self) -> None:
        buf = self._buffer
        header_size = self._header_size
        packet_size = buf.tell() - self._packet_start
        crypto, packet = self._packet_crypto, self._packet
        if (
            crypto is None  # (no packet is open: aioquic's own says so)
            or packet is None
            or self._packet_type != QuicPacketType.ONE_RTT
            or self._packet_start
            or self._datagram_needs_padding
            or self._quic_logger is not None
            or packet_size < _MIN_PACKET + header_size  # empty (cancelled), or to be padded
        ):
            super()._end_packet()
            return
        number = self._packet_number
        buf.seek(0)  # the short header, as aioquic writes it
        buf.push_uint8(
            PACKET_FIXED_BIT
            | (self._spin_bit << 5)
            | (crypto.key_phase << 2)
            | (PACKET_NUMBER_SEND_SIZE - 1)
        )
        buf.push_bytes(self._peer_cid)
        buf.push_uint16(number & 0xFFFF)
        plain = buf.data_slice(0, packet_size)
        with memoryview(plain) as view:
            # (the stubs say bytes; _OneCopySend's AEAD, in C, reads the view as any buffer)
            payload = view[header_size:]
            datagram = crypto.encrypt_packet(plain[:header_size], payload, number)  # type: ignore[arg-type]
        size = len(datagram)
        packet.sent_bytes = size
        self._packets.append(packet)
        if packet.in_flight:
            self._datagram_flight_bytes += size
        # what aioquic's _flush_current_datagram does with it
        self._datagrams.append(datagram)
        self._flight_bytes += self._datagram_flight_bytes
        self._total_bytes += size
        self._datagram_init = True
        buf.seek(0)
        self._packet_number = number + 1
        self._packet = None
        self.quic_logger_frames = None


_MIN_PACKET = PACKET_NUMBER_MAX_SIZE - PACKET_NUMBER_SEND_SIZE
"""A packet's payload shorter than this is padded so header protection can sample it
(aioquic's ``_end_packet`` pads it; ``_OneCopyBuilder`` leaves such packets to it)."""


class ConnectionArgs(TypedDict, total=False):
    """What ``FastPaths`` passes on to ``_quic.PeerQuicConnection``."""

    configuration: Required[QuicConfiguration]
    max_streams: int
    ledger: ReceiveLedger | None
    original_destination_connection_id: bytes | None
    retry_source_connection_id: bytes | None


class FastPaths(_MixedInto):
    """The overrides, as a mixin in front of ``_quic.PeerQuicConnection`` (which is a
    ``QuicConnection``): ``_quic`` builds the connection class from both when ``FAST``."""

    def __init__(
        self,
        *,
        max_packets_in_flight: int = 1024,
        path_datagram_size: int | None = None,
        **kwargs: Unpack[ConnectionArgs],
    ) -> None:
        super().__init__(**kwargs)
        configuration = kwargs["configuration"]
        self.max_packets_in_flight = max_packets_in_flight
        self._ack_delay = ACK_DELAY
        self._unacked_bytes = 0
        self._unacked_datagrams = 0
        self._ack_every_bytes = _ack_every_bytes(self._max_datagram_size)
        self._ack_ride_packets = CLIENT_ACK_RIDE_PACKETS if configuration.is_client else 1
        self._ack_ride_after = ACK_RIDE_AFTER if configuration.is_client else 0.0
        self._ack_sent_at = float("-inf")  # when the last ACK left (sparse traffic: it rides)
        self._path_datagram_size = path_datagram_size or configuration.max_datagram_size
        self._more_data = False  # a STREAM frame of this packet left data behind
        self._streams_seen = 0  # streams at the start of this packet (a discard frees one)
        self._loss._pacer.__class__ = _BuildPacer
        pacer = cast(_BuildPacer, self._loss._pacer)  # (what its class was just made)
        pacer.owner = weakref.ref(self)
        pacer.after_packet = False

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, SocketAddress]]:
        """aioquic's, after clamping the congestion window to the in-flight cap (and, once
        the handshake is confirmed, switching to the path's datagram size)."""
        if self._path_datagram_size > self._max_datagram_size and self._handshake_confirmed:
            self._use_datagram_size(self._path_datagram_size)
        cc = self._loss._cc
        cap = self.max_packets_in_flight * self._max_datagram_size
        if cc.congestion_window > cap:
            cc.congestion_window = cap
        space = self._spaces.get(tls.Epoch.ONE_RTT)
        if space is None or space.ack_at is None:  # no ACK owed
            self._data_queued = False
            return super().datagrams_to_send(now)
        if self._data_queued:  # the pending ACK leaves with this data, not alone later
            self._data_queued = False
            if self._handshake_confirmed and (
                self._unacked_datagrams >= self._ack_ride_packets
                or space.ack_at <= now + ACK_DELAY - self._ack_ride_after
                or now - self._ack_sent_at >= ACK_DELAY
            ):
                space.ack_at = now
        datagrams = super().datagrams_to_send(now)
        if space.ack_at is None:  # it left
            self._ack_sent_at = now
        return datagrams

    def receive_datagram(self, data: bytes, addr: SocketAddress, now: float) -> None:
        """aioquic's, then the ACK policy: an ACK waits ``ACK_DELAY`` (``BULK_ACK_DELAY``
        after a full datagram), except after ``ACK_EVERY_BYTES`` (or ``ACK_EVERY_DATAGRAMS``
        full datagrams, if fewer bytes) and when this datagram opened a gap in the packet
        numbers received or filled one: the peer learns of a loss, or of a retransmission's
        arrival, without waiting for a timer (RFC 9000 13.2.1: out-of-order packets are
        acknowledged at once)."""
        space = self._spaces.get(tls.Epoch.ONE_RTT)
        if space is None or space.ack_at is None:
            self._unacked_bytes = self._unacked_datagrams = 0  # the last ACK went out
        if space is None:
            super().receive_datagram(data, addr, now)
            return
        top, ranges = space.largest_received_packet, len(space.ack_queue)
        super().receive_datagram(data, addr, now)
        if space.ack_at is not None:
            self._unacked_bytes += len(data)
            self._unacked_datagrams += 1
            new_top = space.largest_received_packet  # (one 1-RTT packet per datagram)
            if (
                new_top > top + 1 >= 1  # packets between the last one and this are missing
                or (new_top == top and len(space.ack_queue) != ranges)  # one below the top
                or self._unacked_bytes >= self._ack_every_bytes
            ):
                space.ack_at = now
            elif 2 * len(data) >= self._max_datagram_size and space.ack_at > now + BULK_ACK_DELAY:
                space.ack_at = now + BULK_ACK_DELAY

    def ack_now(self, now: float) -> None:
        """Send the ACK we owe with the next build instead of after ``ACK_DELAY`` (for
        datagrams that waited in the socket: their sender's loss timer is already running)."""
        space = self._spaces.get(tls.Epoch.ONE_RTT)
        if space is not None and space.ack_at is not None:
            space.ack_at = now

    def _use_datagram_size(self, size: int) -> None:
        """Raise the datagram size after the handshake. The handshake runs at a small size
        because aioquic pads every Initial datagram to the full size (64 KiB on loopback
        would triple the handshake time); congestion control restarts at the new size,
        keeping its count of bytes in flight."""
        loss = self._loss
        old = loss._cc
        loss._cc = create_congestion_control(
            self._configuration.congestion_control_algorithm, max_datagram_size=size
        )
        loss._cc.bytes_in_flight = old.bytes_in_flight
        loss._pacer._max_datagram_size = size
        self._max_datagram_size = size
        self._ack_every_bytes = _ack_every_bytes(size)

    def _write_application(
        self, builder: QuicPacketBuilder, network_path: QuicNetworkPath, now: float
    ) -> None:
        if type(builder) is QuicPacketBuilder:
            builder.__class__ = _OneCopyBuilder  # (fewer copies: see the module doc)
        self._more_data = False
        self._streams_seen = len(self._streams)
        super()._write_application(builder, network_path, now)

    def _nothing_left(self) -> bool:
        """After a 1-RTT packet was built: whether another one would be empty (the build
        then ends, see the class doc). Every writer but STREAM's and CRYPTO's writes all it
        has or stops the build; a discarded stream may owe the peer MAX_STREAMS."""
        more, self._more_data = self._more_data, False
        seen, self._streams_seen = self._streams_seen, len(self._streams)
        if more or seen != len(self._streams) or not self._handshake_confirmed:
            return False
        if self._datagrams_pending:
            return False
        crypto = self._crypto_streams.get(tls.Epoch.ONE_RTT)
        return crypto is None or not (len(crypto.sender._pending) or crypto.sender._pending_eof)

    def _initialize(self, peer_cid: bytes) -> None:
        super()._initialize(peer_cid)
        self._cryptos[tls.Epoch.ONE_RTT].send.__class__ = _OneCopySend  # (fewer copies)

    def _write_stream_frame(
        self,
        builder: QuicPacketBuilder,
        space: QuicPacketSpace,
        stream: QuicStream,
        max_offset: int,
    ) -> int:
        sid = stream.stream_id
        if sid is None:  # (a crypto stream: aioquic writes those as CRYPTO frames, not here)
            return 0
        sender = stream.sender
        offset = sender.next_offset
        # type byte + stream id + offset (omitted at 0) + a 4-byte length
        overhead = 5 + size_uint_var(sid) + (size_uint_var(offset) if offset else 0)
        before = sender.highest_offset
        room = builder.remaining_flight_space - overhead
        frame = _take_frame(sender, room, max_offset)
        if frame is None:
            if not sender.buffer_is_empty:  # no room (or no credit) left in this packet
                self._more_data = True
            return 0
        frame_type = QuicFrameType.STREAM_BASE | 2 | (4 if frame.offset else 0) | int(frame.fin)
        buf = builder.start_frame(
            frame_type,
            capacity=overhead,
            handler=sender.on_data_delivery,
            handler_args=(frame.offset, frame.offset + len(frame.data), frame.fin),
        )
        buf.push_uint_var(sid)
        if frame.offset:
            buf.push_uint_var(frame.offset)
        buf.push_uint32(len(frame.data) | 0x80000000)
        buf.push_bytes(frame.data)
        if len(sender._pending) or sender._pending_eof:
            self._more_data = True
        else:  # what the next get_frame would find: nothing to send (see _nothing_left)
            sender.buffer_is_empty = True
        return sender.highest_offset - before


# -- the conformance check -----------------------------------------------------------------

OVERRIDDEN: dict[tuple[type, str], tuple[str, ...]] = {
    (QuicConnection, "datagrams_to_send"): ("now",),
    (QuicConnection, "receive_datagram"): ("data", "addr", "now"),
    (QuicConnection, "_write_application"): ("builder", "network_path", "now"),
    (QuicConnection, "_write_stream_frame"): ("builder", "space", "stream", "max_offset"),
    (QuicConnection, "_initialize"): ("peer_cid",),
    (QuicPacketBuilder, "_end_packet"): (),
    (QuicPacketBuilder, "start_frame"): ("frame_type", "capacity", "handler", "handler_args"),
    (QuicPacketPacer, "next_send_time"): ("now",),
    (QuicPacketPacer, "update_after_send"): ("now",),
    (CryptoContext, "encrypt_packet"): ("plain_header", "plain_payload", "packet_number"),
    (QuicStreamSender, "get_frame"): ("max_size", "max_offset"),
    (QuicStreamSender, "on_data_delivery"): ("delivery", "start", "stop", "fin"),
}
"""Methods the overrides replace or call, with the parameters they assume (after self)."""

ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "connection": (
        "_ack_delay",
        "_configuration",
        "_crypto_streams",
        "_cryptos",
        "_datagrams_pending",
        "_handshake_confirmed",
        "_loss",
        "_max_datagram_size",
        "_quic_logger",
        "_spaces",
        "_streams",
    ),
    "loss": ("_cc", "_pacer"),
    "pacer": ("_max_datagram_size",),
    "congestion": ("bytes_in_flight", "congestion_window"),
    "space": ("ack_at", "ack_queue", "largest_received_packet"),
    "builder": (
        "_buffer",
        "_datagram_flight_bytes",
        "_datagram_init",
        "_datagram_needs_padding",
        "_datagrams",
        "_flight_bytes",
        "_header_size",
        "_packet",
        "_packet_crypto",
        "_packet_number",
        "_packet_start",
        "_packet_type",
        "_packets",
        "_peer_cid",
        "_quic_logger",
        "_spin_bit",
        "_total_bytes",
        "remaining_flight_space",
    ),
    "sender": (
        "_buffer",
        "_buffer_fin",
        "_buffer_start",
        "_pending",
        "_pending_eof",
        "_reset_error_code",
        "buffer_is_empty",
        "highest_offset",
        "next_offset",
    ),
    "crypto": ("aead", "hp", "key_phase"),
}
"""Instance attributes the overrides read or set, per object (checked on fresh objects made
through aioquic's public constructors)."""


def _instances() -> dict[str, object]:
    """One of each object the overrides touch, made through public constructors."""
    conn = QuicConnection(configuration=QuicConfiguration(is_client=True))
    conn.connect(("127.0.0.1", 4433), now=0.0)
    loss = conn._loss
    builder = QuicPacketBuilder(
        host_cid=b"h" * 8, peer_cid=b"p" * 8, version=1, is_client=True, max_datagram_size=1200
    )
    return {
        "connection": conn,
        "loss": loss,
        "pacer": loss._pacer,
        "congestion": loss._cc,
        "space": QuicPacketSpace(),
        "builder": builder,
        "sender": QuicStreamSender(0, True),
        "crypto": CryptoContext(),
    }


def surface_problems() -> list[str]:
    """What of aioquic's private surface the overrides need is missing or changed (empty:
    the overrides fit this aioquic)."""
    problems = []
    for (klass, name), params in OVERRIDDEN.items():
        method = getattr(klass, name, None)
        if method is None:
            problems.append(f"{klass.__name__}.{name} is gone")
            continue
        try:
            got = tuple(inspect.signature(method).parameters)[1:]
        except (TypeError, ValueError):
            continue  # (a compiled method: no signature to compare)
        if got != params:
            problems.append(f"{klass.__name__}.{name}{got} is not ({', '.join(params)})")
    try:
        objects = _instances()
    except Exception as exc:  # a changed constructor is a mismatch too
        return [*problems, f"aioquic's objects cannot be made as expected: {exc!r}"]
    for kind, names in ATTRIBUTES.items():
        obj = objects[kind]
        present = set(dir(obj))
        problems += [f"{kind} has no {n}" for n in names if n not in present]
    if not hasattr(HeaderProtection, "_mask"):
        problems.append("HeaderProtection has no _mask")
    return problems


def _decide() -> tuple[bool, str | None]:
    if os.environ.get(STOCK_ENV, "") not in ("", "0"):
        return False, f"{STOCK_ENV} is set"
    problems = surface_problems()
    if problems:
        reason = "aioquic's private surface changed: " + "; ".join(problems)
        log.warning("running stock aioquic (slower): %s", reason)
        return False, reason
    return True, None


FAST, STOCK_REASON = _decide()
"""Whether the overrides are in use, and if not, why (the environment, or the check)."""
