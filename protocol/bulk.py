"""Bulk transfers, sans I/O: a tensor's bytes in bounded chunks, acknowledged, resumable.

A bulk stream carries one transfer: a frame holding ``Bulk{bulk_id, size, offset}``, then
raw-bytes frames of at most ``BULK_CHUNK`` covering ``offset..size``. The receiver writes
each chunk straight into the destination buffer (allocated once, at the size the header
announces) and answers on the same stream with ``BulkAck{bulk_id, received}`` at least every
``BULK_ACK_EVERY`` bytes and when the transfer is whole. The sender ends its direction after
the final BulkAck, the receiver after the sender's end.

When a link dies mid-transfer both ends keep their state (the receiver its partial buffer,
the sender its bytes and the last acknowledged offset); on the resumed connection the sender
opens a new stream starting at that offset. Bytes between the acknowledged offset and what
the receiver had are written again with the same values, so nothing is lost and the message
that waits for the transfer is applied once, when the transfer is whole.

Both shells (the server's trio pump, the client's reader thread) drive these two classes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from . import messages as m


class BulkSend:
    """The sending side of one transfer: the bytes and how far the receiver acknowledged."""

    __slots__ = ("bulk_id", "view", "acked", "keep", "chunk")

    def __init__(self, bulk_id: int, data: Any, chunk: int = m.BULK_CHUNK) -> None:
        self.bulk_id = bulk_id
        self.chunk = max(1, min(chunk, m.BULK_CHUNK))
        """Bytes per raw frame: BULK_CHUNK, or less when the receiver's frames are smaller."""
        self.keep = data
        """The object owning the bytes (an array, bytes): alive until the transfer is done."""
        self.view = memoryview(data).cast("B")
        self.acked = 0

    @property
    def size(self) -> int:
        """Bytes of the whole transfer."""
        return self.view.nbytes

    @property
    def done(self) -> bool:
        """True once the receiver has acknowledged every byte (nothing to send again on resume)."""
        return self.acked >= self.size

    def header(self) -> bytes:
        """The stream's first frame: continue from the last acknowledged offset."""
        return m.encode(m.Bulk(self.bulk_id, self.size, self.acked))

    def chunks(self) -> Iterator[memoryview]:
        """The raw-bytes frames from the acknowledged offset on (views, never copies)."""
        view, step = self.view, self.chunk
        for start in range(self.acked, self.size, step):
            yield view[start : start + step]

    def on_ack(self, frame: bytes) -> bool:
        """Apply a BulkAck frame from the receiver; True once the transfer is whole.

        Raises:
            DecodeError: the frame is not a BulkAck of this transfer within its size.
        """
        msgs = m.decode(frame)
        if len(msgs) != 1 or not isinstance(msgs[0], m.BulkAck):
            raise m.DecodeError("a bulk stream's reply must be one BulkAck")
        ack = msgs[0]
        if ack.bulk_id != self.bulk_id or ack.received > self.size:
            raise m.DecodeError(
                f"BulkAck {ack.bulk_id}/{ack.received} does not match bulk "
                f"{self.bulk_id} of {self.size} bytes"
            )
        self.acked = max(self.acked, ack.received)
        return self.done


class BulkReceive:
    """The receiving side of one transfer: the destination buffer and what it holds."""

    __slots__ = ("bulk_id", "buffer", "received", "pos", "acked")

    def __init__(self, bulk_id: int, size: int) -> None:
        self.bulk_id = bulk_id
        self.buffer = np.empty(size, np.uint8)
        """The destination: the tensor is a view of it, so the bytes are copied once."""
        self.received = 0
        self.pos = 0
        self.acked = 0

    @property
    def size(self) -> int:
        """Bytes of the whole transfer (the destination buffer's size)."""
        return int(self.buffer.size)

    @property
    def done(self) -> bool:
        """True once every byte has been received into the buffer."""
        return self.received >= self.size

    def start(self, header: m.Bulk) -> bytes | None:
        """A (new or resumed) stream of this transfer begins; a BulkAck to send at once when
        the transfer is already whole (its final ack was lost with the link).

        Raises:
            DecodeError: the header's size differs or its offset skips bytes never received.
        """
        if header.size != self.size:
            raise m.DecodeError(
                f"bulk {self.bulk_id}: size {header.size} differs from the {self.size} announced"
            )
        if header.offset > self.received:
            raise m.DecodeError(
                f"bulk {self.bulk_id}: offset {header.offset} is past the {self.received} "
                "bytes received"
            )
        self.pos = header.offset
        self.acked = header.offset
        return self._ack() if self.done else None

    def feed(self, chunk: bytes | bytearray | memoryview) -> bytes | None:
        """Write the next chunk into the buffer; a BulkAck frame to send when one is due.

        Raises:
            DecodeError: the chunk is larger than BULK_CHUNK or runs past the size.
        """
        n = len(chunk)
        if n > m.BULK_CHUNK:
            raise m.DecodeError(f"bulk {self.bulk_id}: chunk of {n} bytes > BULK_CHUNK")
        end = self.pos + n
        if end > self.size:
            raise m.DecodeError(f"bulk {self.bulk_id}: {end} bytes sent, {self.size} announced")
        self.buffer[self.pos : end] = np.frombuffer(chunk, np.uint8)
        self.pos = end
        self.received = max(self.received, end)
        if end == self.size or end - self.acked >= m.BULK_ACK_EVERY:
            return self._ack()
        return None

    def _ack(self) -> bytes:
        self.acked = self.pos if not self.done else self.size
        return m.encode(m.BulkAck(self.bulk_id, self.acked))


def byte_view(array: Any) -> np.ndarray:
    """A flat uint8 view of an array's bytes (a copy only when it is not C-contiguous)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def parse_header(frame: bytes | None) -> m.Bulk:
    """The Bulk header that opens a bulk stream.

    Raises:
        DecodeError: the frame is missing or is not one Bulk message.
    """
    msgs = m.decode(frame or b"")
    if len(msgs) != 1 or not isinstance(msgs[0], m.Bulk):
        raise m.DecodeError("a bulk stream must start with one Bulk message")
    return msgs[0]


__all__ = ["BulkReceive", "BulkSend", "byte_view", "parse_header"]
