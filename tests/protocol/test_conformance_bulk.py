"""Conformance, section 3's bulk streams in detail (issue 38 gaps 5-7): the encoding and
kind of a bulk stream, running ahead of BulkAck, the order of an Upload and its bytes, and
a refused transfer's STOP_SENDING code. A real server, raw frames (wire.py); the figures are
read from protocol/README.md."""

from __future__ import annotations

import queue
import re
from pathlib import Path

import msgpack
import numpy as np
import pytest
from burn_remote.server.testing import Daemon

from . import spec
from .wire import ERR, F32, MAX_FRAME, MSG, QUOTA, Raw, errors, frame, msg, stream_frames

pytestmark = pytest.mark.timeout(300)

STREAMS = " ".join(spec.README.read_text().split("## 3. Streams", 1)[1].split("\n## ")[0].split())
ACK_EVERY = int(re.search(r"`BULK_ACK_EVERY` \((\d+) MiB\)", STREAMS).group(1)) * 2**20  # type: ignore[union-attr]
REFUSED, TOO_LONG = (
    int(n)
    for n in re.search(  # type: ignore[union-attr]
        r"STOP_SENDING on that stream with application error code (\d+) \(a frame longer than "
        r"the receiver's limit: code (\d+)\)",
        STREAMS,
    ).groups()
)


def _client(server: Daemon, tmp_path: Path) -> tuple[Raw, dict]:
    client = Raw(server, tmp_path / "key")
    return client, client.hello()["limits"]


def test_a_bulk_stream_is_a_bidirectional_stream_of_one_header_then_chunks_acked_every_2_mib(
    server: Daemon, tmp_path: Path
) -> None:
    """Encoding and stream kind: the sender opens a bidirectional stream (client: ids 0 mod 4,
    server: 1 mod 4); its first frame is exactly `[[17, bulk_id, size, offset]]`, then raw
    chunks of at most `bulk_chunk`; the receiver answers `[[18, bulk_id, received]]` frames
    at least every BULK_ACK_EVERY and at the end. Running ahead: every chunk is sent here
    before any BulkAck is read (QUIC flow control alone bounds it)."""
    raw, limits = _client(server, tmp_path)
    payload = np.random.default_rng(1).integers(0, 256, 4 * ACK_EVERY + 77, np.uint8).tobytes()
    sid = raw.conn.open_stream()
    assert sid % 4 == 0  # a client-initiated bidirectional stream
    raw.conn.send_frame(sid, frame([MSG["Bulk"].tag, 5, len(payload), 0]))
    for start in range(0, len(payload), limits["bulk_chunk"]):
        raw.conn.send_frame(sid, payload[start : start + limits["bulk_chunk"]])
    # the Upload after its bytes (Order: either way round)
    raw.send(msg("Upload", 1, 9, "uint8", [len(payload)], b"", 5), msg("Read", 2, 9))
    (data,) = raw.replies("Data")
    acks = [msgpack.unpackb(f, raw=False) for f in raw.other.get(sid, []) if f is not None]
    assert all(a == [[MSG["BulkAck"].tag, 5, a[0][2]]] for a in acks), acks
    received = [a[0][2] for a in acks]
    assert received == sorted(received) and received[-1] == len(payload)
    assert all(b - a <= ACK_EVERY for a, b in zip([0, *received], received))
    raw.conn.finish(sid)

    assert data["data"] == b"" and data["bulk_id"] > 0  # the download: the server's stream
    while not any(s % 4 == 1 for s in raw.other):
        got, chunk = raw.inbox.get(timeout=60)
        raw.other.setdefault(got, []).append(chunk)
    (down,) = (s for s in raw.other if s % 4 == 1)  # a server-initiated bidirectional stream
    frames = stream_frames(raw, down, 1)
    assert msgpack.unpackb(frames[0], raw=False) == [
        [MSG["Bulk"].tag, data["bulk_id"], len(payload), 0]
    ]
    chunks = len(range(0, len(payload), limits["bulk_chunk"]))
    frames = stream_frames(raw, down, 1 + chunks)
    assert all(0 < len(f) <= limits["bulk_chunk"] for f in frames[1:] if f is not None)
    assert b"".join(f for f in frames[1:] if f is not None) == payload
    raw.conn.send_frame(down, frame(msg("BulkAck", data["bulk_id"], len(payload))))
    raw.close()


def test_an_upload_before_its_bytes_holds_the_messages_after_it(
    server: Daemon, tmp_path: Path
) -> None:
    """Order: an Upload whose transfer is not whole holds the control messages after it; the
    Sync behind it is answered only once the rest of the bytes came."""
    raw, limits = _client(server, tmp_path)
    payload = bytes(range(256)) * (2 * ACK_EVERY // 256)
    raw.send(msg("Upload", 3, 4, "uint8", [len(payload)], b"", 7), msg("Sync", 4))
    sid = raw.conn.open_stream()
    raw.conn.send_frame(sid, frame(msg("Bulk", 7, len(payload), 0)))
    for start in range(0, ACK_EVERY, limits["bulk_chunk"]):
        raw.conn.send_frame(sid, payload[start : start + limits["bulk_chunk"]])
    (ack,) = stream_frames(raw, sid, 1)  # the first BulkAck: half the bytes are there
    assert msgpack.unpackb(ack, raw=False) == [[MSG["BulkAck"].tag, 7, ACK_EVERY]]
    with pytest.raises(queue.Empty):  # no Ack for the Sync yet (it waits for the bytes)
        next(raw.frames(timeout=1.0))
    for start in range(ACK_EVERY, len(payload), limits["bulk_chunk"]):
        raw.conn.send_frame(sid, payload[start : start + limits["bulk_chunk"]])
    (reply,) = raw.replies("Ack")
    assert reply["request_id"] == 4
    raw.send(msg("MemoryStats", 5, 0, 0, 0, 0, 0, 0, 0, 0, 0))
    (stats,) = raw.replies("MemoryStats")
    assert (stats["session_tensors"], stats["session_bytes"]) == (1, len(payload))
    raw.close()


def _stopped(raw: Raw, sid: int) -> int:
    """The code of the server's STOP_SENDING on ``sid``, once it came."""
    for _ in range(600):
        if sid in raw.conn.stopped:
            return raw.conn.stopped[sid]
        try:
            got, data = raw.inbox.get(timeout=0.1)
            raw.other.setdefault(got, []).append(data)
        except queue.Empty:
            pass
    raise AssertionError(f"no STOP_SENDING on stream {sid}")


def test_a_refused_transfer_is_stopped_with_the_documented_code_and_fails_its_upload(
    server: Daemon, tmp_path: Path
) -> None:
    """Refusal: a transfer over the memory quota is stopped with code 2 (REFUSED here, read
    from the spec) and its Upload fails LIMIT naming its request id; a stream whose first
    frame is longer than the limit is stopped with code 1 and fails the next Upload waiting
    for a transfer; nothing is stored and the session goes on."""
    raw, _ = _client(server, tmp_path)
    raw.send(msg("Upload", 11, 1, F32, [(QUOTA + 4) // 4], b"", 1))
    big = raw.conn.open_stream()
    raw.conn.send_frame(big, frame(msg("Bulk", 1, QUOTA + 4, 0)))
    assert _stopped(raw, big) == REFUSED
    raw.send(msg("Sync", 12))
    (err,) = errors(raw.replies("Ack"))
    assert (err["code"], err["request_id"]) == (ERR["LIMIT"], 11)

    long = raw.conn.open_stream()
    raw.conn.send_frame(long, bytes(MAX_FRAME + 1))  # the header frame: over max_frame
    assert _stopped(raw, long) == TOO_LONG
    raw.send(msg("Upload", 13, 2, "uint8", [8], b"", 2), msg("Sync", 14))
    (err,) = errors(raw.replies("Ack"))
    assert err["request_id"] == 13 and err["code"] in (ERR["LIMIT"], ERR["MALFORMED"])
    raw.send(msg("Read", 15, 1), msg("Read", 16, 2), msg("Sync", 17))
    missing = errors(raw.replies("Ack"))
    assert [(e["code"], e["request_id"]) for e in missing] == [
        (ERR["MISSING_TENSOR"], 15),
        (ERR["MISSING_TENSOR"], 16),
    ]
    raw.close()
