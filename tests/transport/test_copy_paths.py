"""The fewer-copies paths of ``_quic_fast`` (a client's and a server's) against aioquic's own code as the oracle: the
same protected packets (``_OneCopySend`` vs ``CryptoContext.encrypt_packet``), the same stream
frames and sender state (``_take_frame`` vs ``QuicStreamSender.get_frame``), the same
datagrams and packet records (``_OneCopyBuilder`` vs ``QuicPacketBuilder``). In memory, no
sockets; random contents from a seeded generator."""

from __future__ import annotations

import random

import pytest
from aioquic.quic.crypto import CryptoContext, CryptoPair
from aioquic.quic.packet import QuicFrameType, QuicPacketType
from aioquic.quic.packet_builder import (
    QuicDeliveryState,
    QuicPacketBuilder,
    QuicPacketBuilderStop,
)
from aioquic.quic.stream import QuicStreamSender
from aioquic.tls import CipherSuite
from burn_remote.protocol.transport._quic_fast import _OneCopyBuilder, _OneCopySend, _take_frame

VERSION = 0x00000001
SUITES = [
    CipherSuite.AES_128_GCM_SHA256,
    CipherSuite.AES_256_GCM_SHA384,
    CipherSuite.CHACHA20_POLY1305_SHA256,
]


def _context(suite: CipherSuite, cls: type = CryptoContext) -> CryptoContext:
    ctx = CryptoContext()
    ctx.setup(cipher_suite=suite, secret=bytes(range(48)), version=VERSION)
    ctx.__class__ = cls
    return ctx


@pytest.mark.parametrize("suite", SUITES, ids=lambda s: s.name)
@pytest.mark.parametrize("long_header", [False, True])
@pytest.mark.parametrize("pn_length", [1, 2, 3, 4])
def test_one_copy_protection_gives_aiquics_bytes(
    suite: CipherSuite, long_header: bool, pn_length: int
) -> None:
    rng = random.Random(f"{suite}{long_header}{pn_length}")
    stock, ours = _context(suite), _context(suite, _OneCopySend)
    for size in (pn_length + 16, 40, 1200, 65000):  # (the sample needs 16 bytes past the pn)
        first = (0xC0 if long_header else 0x40) | (pn_length - 1) | rng.randrange(4) << 2
        header = bytes([first]) + rng.randbytes(8 if long_header else 20) + bytes(pn_length)
        payload = rng.randbytes(size)
        number = rng.randrange(1 << 30)
        want = stock.encrypt_packet(header, payload, number)
        assert ours.encrypt_packet(header, payload, number) == want
        assert ours.encrypt_packet(header, memoryview(payload), number) == want  # a view too
        assert type(ours.encrypt_packet(header, payload, number)) is bytes


def _sender_state(s: QuicStreamSender) -> tuple:
    return (
        list(s._pending),
        s.highest_offset,
        s._pending_eof,
        s.buffer_is_empty,
        s._buffer_start,
        bytes(s._buffer),
    )


@pytest.mark.parametrize("seed", range(6))
def test_take_frame_gives_the_frames_and_state_get_frame_gives(seed: int) -> None:
    """Writes, takes of every size (negative, zero, past the data, past the flow-control
    limit), acknowledgements and losses (which put ranges back), a FIN, a reset stream: each
    frame and the sender's state afterwards are the same as aioquic's."""
    rng = random.Random(seed)
    stock, ours = QuicStreamSender(0, True), QuicStreamSender(0, True)
    sent: list[tuple[int, int, bool]] = []
    written = 0
    for step in range(400):
        action = rng.random()
        if action < 0.25 and stock._buffer_fin is None:
            data = rng.randbytes(rng.choice([0, 1, 100, 5000, 70000]))
            fin = rng.random() < 0.03
            stock.write(data, end_stream=fin)
            ours.write(data, end_stream=fin)
            written += len(data)
        elif action < 0.75:
            max_size = rng.choice([-1, 0, 1, 7, 1000, 65000, 200000])
            max_offset = rng.choice([None, written // 2, written, written + 10, 0])
            want = stock.get_frame(max_size, max_offset)
            got = _take_frame(ours, max_size, max_offset)
            assert (got is None) == (want is None), step
            if want is not None:
                assert (got.offset, bytes(got.data), got.fin) == (
                    want.offset,
                    bytes(want.data),
                    want.fin,
                ), step
                assert type(got.data) is bytes
                sent.append((want.offset, want.offset + len(want.data), want.fin))
        elif sent:
            start, stop, fin = sent.pop(rng.randrange(len(sent)))
            state = rng.choice([QuicDeliveryState.ACKED, QuicDeliveryState.LOST])
            stock.on_data_delivery(state, start, stop, fin)
            ours.on_data_delivery(state, start, stop, fin)
        assert _sender_state(ours) == _sender_state(stock), step
    stock.reset(3)  # (no effect on a stream already finished)
    ours.reset(3)
    assert _outcome(_take_frame, ours) == _outcome(QuicStreamSender.get_frame, stock)


def _outcome(take, sender: QuicStreamSender) -> tuple:
    """A take after a reset: aioquic refuses it (an assertion) unless the stream finished."""
    try:
        frame = take(sender, 1000, None)
    except AssertionError:
        return ("refused",)
    return ("taken", None if frame is None else (frame.offset, bytes(frame.data), frame.fin))


def _pair(is_client: bool = True) -> CryptoPair:
    pair = CryptoPair()
    pair.setup_initial(cid=bytes(8), is_client=is_client, version=VERSION)
    return pair


def _build(cls: type, script: list, pair: CryptoPair, is_client: bool = True) -> tuple:
    builder = QuicPacketBuilder(
        host_cid=bytes(8),
        peer_cid=bytes(range(8)),
        version=VERSION,
        is_client=is_client,
        max_datagram_size=65000,
        packet_number=70000,
    )
    builder.__class__ = cls
    for kind, frames in script:
        try:
            builder.start_packet(kind, pair)
            for frame_type, data in frames:
                buf = builder.start_frame(frame_type, capacity=len(data) + 1)
                buf.push_bytes(data)
        except QuicPacketBuilderStop:
            break
    datagrams, packets = builder.flush()
    records = [
        (p.packet_number, p.sent_bytes, p.in_flight, p.is_ack_eliciting, p.packet_type)
        for p in packets
    ]
    return datagrams, records, builder.packet_number, builder._flight_bytes, builder._total_bytes


@pytest.mark.parametrize("is_client", [True, False], ids=["client", "server"])
def test_one_copy_builder_gives_aioquics_datagrams(is_client: bool) -> None:
    rng = random.Random(1)
    one_rtt, initial = QuicPacketType.ONE_RTT, QuicPacketType.INITIAL
    stream, ack = QuicFrameType.STREAM_BASE, QuicFrameType.ACK
    scripts = [
        [(one_rtt, [(stream, rng.randbytes(64000))])],  # one full packet
        [(one_rtt, [(stream, rng.randbytes(n))]) for n in (64000, 64000, 40000)],  # a batch
        [(one_rtt, [(ack, b"\x05\x00"), (stream, rng.randbytes(3000))])],
        [(one_rtt, [(ack, b"")])],  # a one-byte payload: padded (aioquic's path)
        [(one_rtt, [])],  # nothing written: the packet is cancelled
        [(one_rtt, [(ack, b"\x01\x02")])],  # an ACK alone: not in flight
        [(initial, [(QuicFrameType.CRYPTO, rng.randbytes(300))]), (one_rtt, [(stream, b"x" * 9)])],
        [(one_rtt, [(stream, rng.randbytes(70000))])],  # too big: the build stops
    ]
    for script in scripts:
        want = _build(QuicPacketBuilder, script, _pair(is_client), is_client)
        got = _build(_OneCopyBuilder, script, _pair(is_client), is_client)
        assert got == want
        assert all(type(d) is bytes for d in got[0])
