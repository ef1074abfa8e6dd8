"""Records between a remote device and its link process, over one local stream socket.

A record is a 13-byte header (kind, a 64-bit argument, payload length) and the payload. The
user's side sends ``BATCH`` (a control frame; the argument counts the ``BULK`` records that
follow and belong to it) and ``CLOSE``; the link process sends ``CONTROL`` and ``BULK`` (the
server's frames) and ``FATAL`` (why the connection ended, UTF-8). This is a private pipe
between two processes of one program, not the wire format (that is ``protocol.messages``).
"""

from __future__ import annotations

import socket
import struct

HEADER = struct.Struct(">BQI")
"""kind, argument (bulk id or bulk count), payload length."""

BATCH, BULK, CLOSE, CONTROL, FATAL = range(1, 6)

INLINE_PAYLOAD = 64 * 1024
"""Payloads up to this size are written with their header in one call (one small copy);
larger ones in a second call, without a copy."""


def record_parts(kind: int, arg: int = 0, payload: bytes = b"") -> tuple[bytes, ...]:
    """The buffers to write, in order: header and payload joined when the payload is small
    (one write), apart when it is large (no copy of a big tensor to prepend 13 bytes)."""
    header = HEADER.pack(kind, arg, len(payload))
    if len(payload) <= INLINE_PAYLOAD:
        return (header + payload,)
    return (header, payload)


def send_record(sock: socket.socket, kind: int, arg: int = 0, payload: bytes = b"") -> None:
    """Write one record (blocking)."""
    for part in record_parts(kind, arg, payload):
        sock.sendall(part)


def read_exact(sock: socket.socket, n: int) -> bytearray | None:
    """``n`` bytes, or None at end of stream (the other process is gone)."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            return None
        got += k
    return buf


def read_record(sock: socket.socket) -> tuple[int, int, bytearray] | None:
    """The next (kind, argument, payload), or None at end of stream."""
    header = read_exact(sock, HEADER.size)
    if header is None:
        return None
    kind, arg, size = HEADER.unpack(header)
    payload = read_exact(sock, size) if size else bytearray()
    if payload is None:
        return None
    return kind, arg, payload


__all__ = [
    "BATCH",
    "BULK",
    "CLOSE",
    "CONTROL",
    "FATAL",
    "HEADER",
    "INLINE_PAYLOAD",
    "read_record",
    "record_parts",
    "send_record",
]
