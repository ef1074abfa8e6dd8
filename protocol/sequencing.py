"""Sequenced control frames for session resume (see server/_resume.py and protocol/README.md).

A sequenced frame is ``0xC1, seq u64, ack u64, inner frame``: 0xC1 is the one byte msgpack
never uses, so it cannot be confused with a plain frame (a msgpack array). ``seq`` numbers
the sender's frames from 1 (0: a control-only frame, not counted); ``ack`` is the last
``seq`` the sender has received from the other side.
"""

from __future__ import annotations

import struct

from .messages import SESSION_EXPIRED  # the error code lives with the others

MAGIC = 0xC1
HEADER = struct.Struct(">BQQ")


def wrap(seq: int, ack: int, inner: bytes) -> bytes:
    """A sequenced frame around ``inner``."""
    return HEADER.pack(MAGIC, seq, ack) + inner


def unwrap(frame: bytes) -> tuple[int, int, bytes] | None:
    """(seq, ack, inner) of a sequenced frame, or None for a plain one."""
    if len(frame) < HEADER.size or frame[0] != MAGIC:
        return None
    _, seq, ack = HEADER.unpack_from(frame)
    return seq, ack, frame[HEADER.size :]


__all__ = ["HEADER", "MAGIC", "SESSION_EXPIRED", "unwrap", "wrap"]
