"""Bulk transfers, sans I/O: chunking, acknowledgement, and resuming from the last ack."""

from __future__ import annotations

import numpy as np
import pytest
from burn_remote.protocol import messages as m
from burn_remote.protocol.bulk import BulkReceive, BulkSend, byte_view, parse_header


def _payload(nbytes: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)


def _ack(frame: bytes) -> m.BulkAck:
    (msg,) = m.decode(frame)
    assert isinstance(msg, m.BulkAck)
    return msg


def test_a_transfer_moves_in_bounded_chunks_into_one_buffer_with_acks() -> None:
    data = _payload(3 * m.BULK_ACK_EVERY + 12345)
    send = BulkSend(7, data)
    header = parse_header(send.header())
    assert (header.bulk_id, header.size, header.offset) == (7, data.nbytes, 0)
    rx = BulkReceive(7, header.size)
    assert rx.start(header) is None
    acks = []
    for chunk in send.chunks():
        assert len(chunk) <= m.BULK_CHUNK
        if (ack := rx.feed(chunk)) is not None:
            acks.append(_ack(ack).received)
    assert rx.done and np.array_equal(rx.buffer, data)
    assert acks == [m.BULK_ACK_EVERY, 2 * m.BULK_ACK_EVERY, 3 * m.BULK_ACK_EVERY, data.nbytes]
    assert send.on_ack(m.encode(m.BulkAck(7, data.nbytes)))


def test_a_cut_transfer_continues_from_the_last_ack_and_ends_equal() -> None:
    data = _payload(2 * m.BULK_ACK_EVERY + 999)
    send = BulkSend(1, data)
    rx = BulkReceive(1, data.nbytes)
    rx.start(parse_header(send.header()))
    cut = m.BULK_ACK_EVERY + m.BULK_CHUNK  # the link dies one chunk past an acknowledgement
    for chunk in send.chunks():
        if (ack := rx.feed(chunk)) is not None:
            send.on_ack(ack)
        if rx.received >= cut:
            break
    assert send.acked == m.BULK_ACK_EVERY and rx.received == cut
    header = parse_header(send.header())
    assert header.offset == m.BULK_ACK_EVERY
    rx.start(header)
    for chunk in send.chunks():
        if (ack := rx.feed(chunk)) is not None:
            send.on_ack(ack)
    assert send.done and rx.done and np.array_equal(rx.buffer, data)


def test_the_receiver_refuses_a_gap_a_size_change_and_an_overrun() -> None:
    rx = BulkReceive(1, 10)
    with pytest.raises(m.DecodeError, match="past the 0 bytes received"):
        rx.start(m.Bulk(1, 10, 4))
    with pytest.raises(m.DecodeError, match="differs"):
        rx.start(m.Bulk(1, 11, 0))
    rx.start(m.Bulk(1, 10, 0))
    with pytest.raises(m.DecodeError, match="11 bytes sent, 10 announced"):
        rx.feed(b"x" * 11)
    with pytest.raises(m.DecodeError, match="BULK_CHUNK"):
        BulkReceive(2, 2 * m.BULK_CHUNK).feed(b"x" * (m.BULK_CHUNK + 1))


def test_the_sender_refuses_an_ack_of_another_transfer() -> None:
    send = BulkSend(3, b"abc")
    with pytest.raises(m.DecodeError, match="does not match"):
        send.on_ack(m.encode(m.BulkAck(4, 3)))
    with pytest.raises(m.DecodeError, match="does not match"):
        send.on_ack(m.encode(m.BulkAck(3, 4)))
    with pytest.raises(m.DecodeError, match="BulkAck"):
        send.on_ack(m.encode(m.Sync(1)))


def test_byte_view_is_a_view_of_any_contiguous_array() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    v = byte_view(a)
    assert v.dtype == np.uint8 and v.nbytes == a.nbytes and np.shares_memory(v, a)
    assert BulkSend(1, v).size == a.nbytes
