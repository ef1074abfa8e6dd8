"""The conformance suite's client: raw frames built only from the tables of
protocol/README.md (tests/protocol/spec.py reads them). Nothing of the client package is
used: messages are msgpack arrays written here, over the transport's QUIC connection."""

from __future__ import annotations

import hashlib
import queue
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
from burn_remote.protocol.transport import BlockingConnection, EndpointConfig, Identity
from burn_remote.server.testing import Daemon

from . import spec

MSG = spec.messages()
ERR = spec.errors()
TAG_NAME = {s.tag: name for name, s in MSG.items()}
MAX_FRAME = 2 * 2**20
QUOTA = 32 * 2**20
MAX_TENSORS = 100
VERSION = 4
F32 = "float32"


def msg(name: str, *values: Any) -> list[Any]:
    """A message as the spec's table lays it out: [tag, fields in order]."""
    fields = MSG[name].fields
    assert len(values) == len(fields), f"{name} takes {[f for f, _ in fields]}"
    return [MSG[name].tag, *values]


def frame(*messages: list[Any]) -> bytes:
    return msgpack.packb(list(messages), use_bin_type=True)


def named(raw: list[Any]) -> dict[str, Any]:
    """A received message as {"name": ..., field: value}, fields named by the spec."""
    spec_ = MSG[TAG_NAME[raw[0]]]
    assert len(raw) == len(spec_.fields) + 1, f"{spec_.name}: {raw!r}"
    return {"name": spec_.name, **{f: v for (f, _), v in zip(spec_.fields, raw[1:])}}


class Raw:
    """One QUIC connection to the server; frames in and out as the spec says."""

    def __init__(self, server: Daemon, key: Path, keepalive: float | None = 10.0) -> None:
        host, port = server.address.rsplit(":", 1)
        self.inbox: queue.Queue[tuple[int, bytes | None]] = queue.Queue()
        self.closed: queue.Queue[Exception] = queue.Queue()
        self.conn = BlockingConnection.connect(
            Identity.load_or_create(key),
            server.peer_id,
            (host, int(port)),
            on_frame=lambda sid, f: self.inbox.put((sid, f)),
            on_closed=self.closed.put,
            config=EndpointConfig(max_frame_size=64 * 2**20, keepalive_interval=keepalive),
        )
        self.control = self.conn.open_stream()
        self.other: dict[int, list[bytes | None]] = {}

    def send(self, *messages: list[Any], raw: bytes | None = None) -> None:
        self.conn.send_frame(self.control, raw if raw is not None else frame(*messages))

    def frames(self, timeout: float = 30.0) -> Iterator[bytes | None]:
        """Control frames as they come; frames of other streams are kept in ``other``."""
        while True:
            sid, data = self.inbox.get(timeout=timeout)
            if sid == self.control:
                yield data
            else:
                self.other.setdefault(sid, []).append(data)

    def replies(self, until: str, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Every message up to and including the first named ``until``."""
        out: list[dict[str, Any]] = []
        for data in self.frames(timeout):
            assert data is not None, f"control stream ended after {out}"
            out.extend(named(raw) for raw in msgpack.unpackb(data, raw=False))
            if any(r["name"] == until for r in out):
                return out
        raise AssertionError("unreachable")

    def hello(self) -> dict[str, Any]:
        self.send(msg("Hello", VERSION, b"", {}))
        (welcome,) = self.replies("Welcome")
        return welcome

    def close(self) -> None:
        self.conn.close("done", flush_timeout=1.0)


def errors(replies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in replies if r["name"] == "Error"]


def upload(tid: int, a: np.ndarray) -> list[Any]:
    a = np.asarray(a, order="C")  # keeps a 0-d array 0-d (ascontiguousarray makes it 1-d)
    return msg("Upload", 0, tid, str(a.dtype), list(a.shape), a.tobytes(), 0)


def graph(inputs: list, nodes: list, outputs: list) -> tuple[bytes, bytes]:
    """A graph encoded per section 5, and its digest."""
    data = msgpack.packb([1, inputs, nodes, outputs], use_bin_type=True)
    return data, hashlib.sha256(data).digest()


SEQUENCED = struct.Struct(">BQQ")
"""Section 10: a sequenced control frame's prefix (marker, seq u64 BE, ack u64 BE)."""
SEQ_MARKER = 0xC1


def wrap(seq: int, ack: int, inner: bytes, marker: int = SEQ_MARKER) -> bytes:
    """``inner`` (a control frame's payload) as a sequenced frame."""
    return SEQUENCED.pack(marker, seq, ack) + inner


def unwrap(data: bytes | None, marker: int = SEQ_MARKER) -> tuple[int, int, list[dict[str, Any]]]:
    """A sequenced frame's seq, ack and named messages."""
    assert data is not None, "the control stream ended"
    got, seq, ack = SEQUENCED.unpack_from(data)
    assert got == marker
    return seq, ack, [named(m) for m in msgpack.unpackb(data[SEQUENCED.size :], raw=False)]


def stream_frames(raw: Raw, sid: int, until: int, timeout: float = 60) -> list[bytes | None]:
    """Frames of stream ``sid`` as they come, until ``until`` of them (control frames kept)."""
    while len(raw.other.get(sid, [])) < until:
        got, data = raw.inbox.get(timeout=timeout)
        raw.other.setdefault(got, []).append(data)
    return raw.other[sid]
