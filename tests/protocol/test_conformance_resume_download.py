"""Conformance, section 3's *resumed download* (issue 38 gap 8): a `Data` whose bulk stream
was cut by a lost link continues, once the session is resumed (section 10), on a new bulk
stream for the same `bulk_id` from the client's last BulkAck; the `Data` message itself is
resent only when the client had not acknowledged its control frame. A real server, raw
frames (wire.py); the figures are read from protocol/README.md."""

from __future__ import annotations

import re
from pathlib import Path

import msgpack
import numpy as np
import pytest
from burn_remote.server.testing import Daemon

from . import spec
from .wire import F32, MSG, SEQ_MARKER, VERSION, Raw, frame, msg, stream_frames, unwrap, wrap

pytestmark = pytest.mark.timeout(300)


def _section(heading: str) -> str:
    return " ".join(spec.README.read_text().split(heading, 1)[1].split("\n## ")[0].split())


STREAMS, RESUME = _section("## 3. Streams"), _section("## 10. Session resume")
ACK_EVERY = int(re.search(r"`BULK_ACK_EVERY` \((\d+) MiB\)", STREAMS).group(1)) * 2**20  # type: ignore[union-attr]
MAGIC = int(re.search(r"`(0x[0-9A-F]{2}), seq u64 BE, ack u64 BE", RESUME).group(1), 16)  # type: ignore[union-attr]
assert MAGIC == SEQ_MARKER, "wire.py writes the marker section 10 names"


def _server_stream(raw: Raw, timeout: float = 60) -> int:
    """The first stream the server opened (a server-initiated bidirectional id, 1 mod 4)."""
    while not any(s % 4 == 1 for s in raw.other):
        got, data = raw.inbox.get(timeout=timeout)
        raw.other.setdefault(got, []).append(data)
    (sid,) = (s for s in raw.other if s % 4 == 1)
    return sid


def _chunks_until(raw: Raw, sid: int, nbytes: int) -> bytes:
    """The raw-bytes frames after a bulk stream's header, until ``nbytes`` of them came."""
    count = 1
    while True:
        frames = stream_frames(raw, sid, count)
        body = b"".join(f for f in frames[1:] if f is not None)
        if len(body) >= nbytes:
            return body
        assert frames[-1] is not None, f"stream {sid} ended after {len(body)} bytes"
        count += 1


@pytest.mark.parametrize("data_seen", [True, False], ids=["data-acked", "data-not-acked"])
def test_a_cut_download_resumes_on_a_new_stream_from_the_last_bulk_ack(
    server: Daemon, tmp_path: Path, data_seen: bool
) -> None:
    """A tensor above the bulk threshold is read; the client acknowledges BULK_ACK_EVERY of
    its download and the link is lost without the goodbye. On resume the server opens a new
    bulk stream whose header is `Bulk{same bulk_id, size, offset = that BulkAck}` and whose
    chunks are exactly the tensor's bytes from there; the `Data` frame is resent (the very
    frame: its seq and bulk_id) only when the resume Hello's `ack` is below it."""
    key = tmp_path / "key"
    first = Raw(server, key)
    first.send(raw=wrap(1, 0, frame(msg("Hello", VERSION, b"", {}))))
    _, _, (welcome,) = unwrap(next(first.frames()))
    limits = welcome["limits"]
    array = np.random.default_rng(8).standard_normal(2 * ACK_EVERY // 4 + 19).astype(np.float32)
    payload = array.tobytes()
    assert len(payload) > limits["bulk_threshold"] and len(payload) > 2 * limits["bulk_chunk"]

    up = first.conn.open_stream()  # the upload: its own bulk stream, then its Upload and a Read
    first.conn.send_frame(up, frame(msg("Bulk", 3, len(payload), 0)))
    for start in range(0, len(payload), limits["bulk_chunk"]):
        first.conn.send_frame(up, payload[start : start + limits["bulk_chunk"]])
    upload = msg("Upload", 1, 5, F32, [array.size], b"", 3)
    first.send(raw=wrap(2, 1, frame(upload, msg("Read", 2, 5))))
    data_seq, data_ack, (data,) = unwrap(next(first.frames()))
    assert (data["name"], data["request_id"], data["data"]) == ("Data", 2, b"")
    assert data["bulk_id"] > 0 and data["shape"] == [array.size]
    final = frame(msg("BulkAck", 3, len(payload)))
    count = 1
    while final not in stream_frames(first, up, count):
        count += 1
    first.conn.finish(up)  # the upload is whole: our side ends after its final BulkAck

    down = _server_stream(first)
    header = msgpack.unpackb(stream_frames(first, down, 1)[0], raw=False)  # type: ignore[arg-type]
    assert header == [[MSG["Bulk"].tag, data["bulk_id"], len(payload), 0]]
    held = _chunks_until(first, down, ACK_EVERY)[:ACK_EVERY]
    first.conn.send_frame(down, frame(msg("BulkAck", data["bulk_id"], ACK_EVERY)))
    first.conn.close("cut", flush_timeout=5.0)  # no goodbye: the server parks the session

    again = Raw(server, key)
    seen = data_seq if data_seen else data_seq - 1
    again.send(raw=wrap(0, seen, frame(msg("Hello", VERSION, welcome["resume_token"], {}))))
    seq, ack, (resumed,) = unwrap(next(again.frames()))
    assert (seq, ack, resumed["name"]) == (0, 2, "Welcome")
    if not data_seen:  # the Data frame was not acknowledged: resent, the very frame
        assert unwrap(next(again.frames())) == (data_seq, data_ack, [data])
    again.send(raw=wrap(3, data_seq, frame(msg("Sync", 4))))
    seq, _, (reply,) = unwrap(next(again.frames()))  # nothing (no second Data) before it
    assert (seq, reply["name"], reply["request_id"]) == (data_seq + 1, "Ack", 4)

    down = _server_stream(again)
    header = msgpack.unpackb(stream_frames(again, down, 1)[0], raw=False)  # type: ignore[arg-type]
    assert header == [[MSG["Bulk"].tag, data["bulk_id"], len(payload), ACK_EVERY]]
    rest = _chunks_until(again, down, len(payload) - ACK_EVERY)
    assert len(rest) == len(payload) - ACK_EVERY
    got = np.frombuffer(held + rest, np.float32)
    np.testing.assert_array_equal(got, array)
    again.conn.send_frame(down, frame(msg("BulkAck", data["bulk_id"], len(payload))))
    assert stream_frames(again, down, len(again.other[down]) + 1)[-1] is None  # server ends
    again.conn.finish(down)
    again.send(raw=wrap(0, data_seq + 1, b""))  # the goodbye
    again.close()
