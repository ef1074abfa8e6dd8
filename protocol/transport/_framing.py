"""Length-prefixed frames over a QUIC stream, without I/O: the prefix's layout and the
reassembly of frames from the pieces QUIC delivers (the blocking client's; the trio side's
`FrameStream` reads its own from a stream it awaits)."""

from __future__ import annotations

import struct

from ._errors import FrameTooLarge

FRAME_PREFIX = struct.Struct(">I")
"""A frame's length, before its bytes."""


class FrameReader:
    """Reassembles the frames of one stream from the pieces QUIC delivers."""

    __slots__ = ("buf", "need", "limit")

    def __init__(self, limit: int) -> None:
        self.buf = bytearray()
        self.need: int | None = None
        self.limit = limit

    def feed(self, data: bytes) -> list[bytes]:
        """The frames ``data`` completes, in order."""
        if not self.buf and self.need is None and len(data) >= 4:
            (size,) = FRAME_PREFIX.unpack_from(data)
            if len(data) == 4 + size and size <= self.limit:
                return [data[4:]]  # the common case: one whole frame in one piece
        self.buf += data
        out: list[bytes] = []
        while True:
            if self.need is None:
                if len(self.buf) < 4:
                    return out
                (size,) = FRAME_PREFIX.unpack_from(self.buf)
                if size > self.limit:
                    raise FrameTooLarge(
                        f"peer sent a {size}-byte frame; max_frame_size is {self.limit}"
                    )
                self.need = size
                del self.buf[:4]
            if len(self.buf) < self.need:
                return out
            out.append(bytes(self.buf[: self.need]))
            del self.buf[: self.need]
            self.need = None


__all__ = ["FRAME_PREFIX", "FrameReader"]
