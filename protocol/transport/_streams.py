"""Frame streams: length-prefixed messages on one QUIC bidirectional stream.

Wire form of a frame: a 4-byte big-endian unsigned payload length, then the payload. A
frame larger than the endpoint's ``max_frame_size`` is refused by the sender before anything
is written and by the receiver as soon as the prefix is read (the stream is then reset).

Sending is back-pressured: at most ``send_buffer`` bytes of a stream may be written to QUIC
and not yet acknowledged; beyond that ``send_frame`` waits, so a fast writer holds at most
``send_buffer`` plus one call's worth of *references* (never copies) to its data.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from ._errors import FrameTooLarge, TransportError

if TYPE_CHECKING:
    from ._connection import Connection

_PREFIX = struct.Struct(">I")
FRAME_PREFIX_SIZE = _PREFIX.size
"""Bytes of the length prefix in front of every frame."""

SMALL_FRAME = 65536
"""Frames up to this size are written in one piece (one copy of the payload)."""

_ERROR_FRAME_TOO_LARGE = 0x1
_ERROR_REFUSED = 0x2


class FrameStream:
    """One bidirectional stream carrying frames; get it from ``Connection.open_stream`` or
    ``Connection.accept_stream``. Not safe for two concurrent senders (or receivers)."""

    def __init__(self, conn: Connection, stream_id: int) -> None:
        self._conn = conn
        self.stream_id = stream_id
        self._chunks: deque[bytes] = deque()
        self._pos = 0  # read position inside self._chunks[0]
        self._buffered = 0  # unread bytes in self._chunks (minus _pos)
        self._eof = False
        self._error: TransportError | None = None
        self._receive_only = False  # _error ended our reading only (we refused a frame)
        self._readable = trio.lowlevel.ParkingLot()
        self._send_closed = False
        self._need: int | None = None  # payload length of the frame being read
        self._partial = False  # part of the current outgoing frame is written
        self.stop_oversized = True
        """Answer an oversized incoming frame with STOP_SENDING. An application that
        replies on the same stream before closing (a control stream) turns it off: a peer
        may take STOP_SENDING for the end of the stream and miss the reply."""
        self.on_frame: Callable[[bytes], bool] | None = None
        """Optional fast path, called on the endpoint's receive loop with a frame that
        arrived whole (in one QUIC chunk) while a reader is parked in ``receive_frame`` and
        nothing else is buffered. It returns True when it took the frame (the reader stays
        parked and never sees it) or False to leave it to the reader. It must not block or
        raise; replies go out with ``send_frame_nowait``. A request answered here costs no
        task switch: the reader would run in the next scheduling batch, after another
        poll of the socket."""

    def __repr__(self) -> str:
        return f"<FrameStream {self.stream_id} of {self._conn!r}>"

    # -- sending ---------------------------------------------------------------------------

    async def send_frame(self, data: bytes | bytearray | memoryview) -> None:
        """Send one frame, waiting while the stream's send buffer is full. A frame of at
        most ``SMALL_FRAME`` bytes that found room returns without yielding to other tasks
        (a caller that loops must await something else, as a receive does).

        Raises:
            FrameTooLarge: ``len(data)`` exceeds the endpoint's ``max_frame_size``.
            TransportError: the stream or connection is closed or reset. If cancelled after
                part of the frame was written, the stream is reset (a half frame would
                corrupt every later one).
        """
        view = memoryview(data).cast("B")
        size = len(view)
        limit = self._conn._config.max_frame_size
        if size > limit:
            raise FrameTooLarge(f"frame of {size} bytes exceeds max_frame_size {limit}")
        if self._send_closed:
            raise TransportError(f"stream {self.stream_id} is closed for sending")
        await trio.lowlevel.checkpoint_if_cancelled()
        prefix = _PREFIX.pack(size)
        self._partial = False
        try:
            if size <= SMALL_FRAME:  # small frames: one write, one copy
                await self._write(prefix + view)
            else:  # large frames: no copy of the payload here
                await self._write(prefix)
                await self._write(view)
        except BaseException:
            if self._partial:
                self._abort_send()
            raise
        if size > SMALL_FRAME:
            # Yield so readers sharing this thread run, but never report a sent frame as
            # failed. A small frame skips it: a reply is followed by the sender's next
            # receive, which yields anyway, and a scheduling round costs more than the send.
            await trio.lowlevel.cancel_shielded_checkpoint()

    def send_frame_nowait(self, data: bytes) -> bool:
        """Send a frame of at most ``SMALL_FRAME`` bytes without waiting, or return False
        (nothing written) when it is larger or the send buffer has no room for it now.
        Called from ``on_frame``, it leaves with the receive loop's one transmit for the
        whole batch of datagrams; from anywhere else, at once.

        Raises:
            TransportError: the stream or connection is closed or reset.
        """
        size = len(data)
        conn = self._conn
        if size > SMALL_FRAME or size > conn._config.max_frame_size:
            return False
        if self._send_closed:
            raise TransportError(f"stream {self.stream_id} is closed for sending")
        conn._check_open()
        if self._error is not None and not self._receive_only:
            raise self._error
        quic = conn._quic
        if conn._config.send_buffer - quic.sender_buffered(self.stream_id) < size + 4:
            return False
        try:
            quic.send_stream_data(self.stream_id, _PREFIX.pack(size) + data)
        except (RuntimeError, ValueError) as exc:  # the peer stopped or reset it
            raise TransportError(f"stream {self.stream_id} is closed: {exc}") from None
        if not conn._in_events:
            conn._transmit()
        return True

    async def _write(self, view: bytes | memoryview) -> None:
        conn = self._conn
        quic = conn._quic
        cap = conn._config.send_buffer
        written = 0
        total = len(view)
        while written < total:
            conn._check_open()
            if self._error is not None and not self._receive_only:
                raise self._error
            room = cap - quic.sender_buffered(self.stream_id)
            if room <= 0:
                await conn._send_space.park()
                continue
            end = min(total, written + room)
            try:
                quic.send_stream_data(self.stream_id, view[written:end])
            except (RuntimeError, ValueError) as exc:  # the peer stopped or reset it
                raise TransportError(f"stream {self.stream_id} is closed: {exc}") from None
            self._partial = True
            written = end
            conn._transmit()

    def stop_reading(self) -> None:
        """Refuse the rest of this stream: the peer is asked to stop sending (STOP_SENDING)
        and what it already sent is dropped; later reads raise TransportError."""
        if self._error is None:
            self._error = TransportError(f"stream {self.stream_id}: we stopped reading")
            self._receive_only = True
            self._discard()
            if self._conn._is_open():
                self._conn._quic.stop_stream(self.stream_id, _ERROR_REFUSED)
                self._conn._transmit()

    def _abort_send(self) -> None:
        if not self._send_closed and self._conn._is_open():
            self._send_closed = True
            self._conn._quic.reset_stream(self.stream_id, _ERROR_FRAME_TOO_LARGE)
            self._conn._transmit()

    async def close(self) -> None:
        """Finish the sending side; the peer reads ``None`` after the last frame."""
        if self._send_closed or not self._conn._is_open():
            self._send_closed = True
            return
        self._send_closed = True
        self._conn._quic.send_stream_data(self.stream_id, b"", end_stream=True)
        self._conn._transmit()
        if self._eof and not self._buffered:
            self._conn._release(self.stream_id)
        await trio.lowlevel.checkpoint()

    # -- receiving -------------------------------------------------------------------------

    async def receive_frame(self) -> bytes | None:
        """The next frame's payload, or ``None`` once the peer closed the stream cleanly.

        Raises:
            FrameTooLarge: the peer announced a frame above ``max_frame_size`` (the stream
                is reset).
            TransportError: the stream was reset, ended inside a frame, or the connection
                closed.
        """
        parked = False  # parking is a checkpoint: a call that parked needs no second one
        while True:
            if self._need is None and not self._pos and self._chunks:
                data = self._whole_frame()
                if data is not None:
                    if not parked:
                        await trio.lowlevel.checkpoint()
                    return data
            if self._need is None and self._buffered >= FRAME_PREFIX_SIZE:
                (size,) = _PREFIX.unpack(self._take(FRAME_PREFIX_SIZE))
                limit = self._conn._config.max_frame_size
                if size > limit:
                    self._fail_receive(
                        FrameTooLarge(f"peer sent a {size}-byte frame; max_frame_size is {limit}")
                    )
                self._need = size
                if size > self._buffered:
                    self._conn._set_frame_credit(self.stream_id, size)
            if self._need is not None and self._buffered >= self._need:
                self._conn._set_frame_credit(self.stream_id, 0)  # before _take grants more
                data = self._take(self._need)
                self._need = None
                if not parked:
                    await trio.lowlevel.checkpoint()
                return data
            if self._error is not None:
                raise self._error
            if self._eof:
                if self._need is None and self._buffered == 0:
                    if self._send_closed:
                        self._conn._release(self.stream_id)
                    await trio.lowlevel.checkpoint()
                    return None
                raise TransportError(f"stream {self.stream_id} ended inside a frame")
            self._conn._check_open()
            await self._readable.park()
            parked = True

    def _whole_frame(self) -> bytes | None:
        """The common case, cheaply: the next chunk QUIC delivered is exactly one frame (a
        small message arrives in one STREAM frame). None otherwise."""
        chunk = self._chunks[0]
        if len(chunk) < FRAME_PREFIX_SIZE:
            return None
        (size,) = _PREFIX.unpack_from(chunk)
        if len(chunk) != FRAME_PREFIX_SIZE + size or size > self._conn._config.max_frame_size:
            return None
        self._chunks.popleft()
        self._buffered -= len(chunk)
        self._conn._consumed(self.stream_id, len(chunk))
        return chunk[FRAME_PREFIX_SIZE:]

    def _take(self, n: int) -> bytes:
        """Remove ``n`` buffered bytes (``n`` <= buffered) with at most one copy."""
        parts: list[bytes | memoryview] = []
        need = n
        while need:
            chunk = self._chunks[0]
            avail = len(chunk) - self._pos
            if avail <= need:
                parts.append(memoryview(chunk)[self._pos :] if self._pos else chunk)
                self._chunks.popleft()
                self._pos = 0
                need -= avail
            else:
                parts.append(memoryview(chunk)[self._pos : self._pos + need])
                self._pos += need
                need = 0
        self._buffered -= n
        self._conn._consumed(self.stream_id, n)
        if len(parts) == 1 and isinstance(parts[0], bytes):
            return parts[0]
        return b"".join(parts)

    def _fail_receive(self, error: TransportError) -> None:
        self._error = error
        self._receive_only = True
        self._discard()
        if self._conn._is_open() and self.stop_oversized:
            self._conn._quic.stop_stream(self.stream_id, _ERROR_FRAME_TOO_LARGE)
            self._conn._transmit()
        raise error

    def _discard(self) -> None:
        """Drop unread data, returning its flow-control credit to the peer."""
        self._conn._set_frame_credit(self.stream_id, 0)
        if self._buffered:
            self._conn._consumed(self.stream_id, self._buffered)
        self._chunks.clear()
        self._pos = self._buffered = 0

    # -- driver side -----------------------------------------------------------------------

    def _feed(self, data: bytes, end_stream: bool) -> None:
        if (
            self.on_frame is not None
            and self._readable
            and not self._chunks
            and self._need is None
            and self._error is None
            and not end_stream
            and self._take_inline(data)
        ):
            return
        if data and self._error is None:
            self._chunks.append(data)
            self._buffered += len(data)
        elif data:
            self._conn._consumed(self.stream_id, len(data))
        if end_stream:
            self._eof = True
        if self._readable:
            self._readable.unpark_all()

    def _take_inline(self, data: bytes) -> bool:
        """Offer ``data`` to ``on_frame`` if it is exactly one frame; True if taken."""
        if len(data) < FRAME_PREFIX_SIZE:
            return False
        (size,) = _PREFIX.unpack_from(data)
        if len(data) != FRAME_PREFIX_SIZE + size or size > self._conn._config.max_frame_size:
            return False
        assert self.on_frame is not None
        if not self.on_frame(data[FRAME_PREFIX_SIZE:]):
            return False
        self._conn._consumed(self.stream_id, len(data))
        return True

    def _fail(self, error: TransportError) -> None:
        if self._error is None or self._receive_only:
            self._error, self._receive_only = error, False
        self._discard()
        if self._readable:
            self._readable.unpark_all()
