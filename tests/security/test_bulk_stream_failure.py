"""A bulk stream that fails while the connection lives (an oversized frame, answered with
STOP_SENDING; a stream the client resets) fails its Upload at once with a named error, and
the session's later control messages are answered right after it, not behind a wait for
bytes that will never come (that wait was BULK_WAIT, 60 s)."""

from __future__ import annotations

import numpy as np
from burn_remote.protocol import messages as m

MAX_FRAME = 2 * m.BULK_CHUNK
"""The attacked server's --max-frame: a bulk chunk fits, a frame one byte over does not."""
ANSWER_WITHIN = 10.0
"""Seconds the test waits for the answers: far less than the old 60 s block, and generous
for a loaded 2-core machine."""


def _upload_then_more(c, bulk_id: int) -> int:
    """An Upload of 2 MiB through bulk ``bulk_id``, and that stream with its header sent."""
    size = 2 * m.BULK_CHUNK
    c.send(m.Upload(0, 1, "uint8", (size,), b"", bulk_id))
    sid = c.conn.open_stream()
    c.conn.send_frame(sid, m.encode(m.Bulk(bulk_id, size, 0)))
    return sid


def _later_messages_answered(c, *words: str) -> None:  # noqa: ANN001
    """The Upload's named error, then the later messages' answers, all promptly."""
    x = np.arange(4, dtype=np.float32)
    c.send(m.Upload(0, 2, "float32", (4,), x.tobytes(), 0), m.Sync(3), m.Read(4, 2))
    got: list = []
    while not any(isinstance(r, m.Data) for r in got):
        got += c.replies(timeout=ANSWER_WITHIN)
    errors = [r for r in got if isinstance(r, m.Error)]
    assert len(errors) == 1 and errors[0].code in (m.LIMIT, m.MALFORMED), got
    for w in words:
        assert w in errors[0].message, errors[0]
    kinds = [type(r).__name__ for r in got]
    assert kinds == ["Error", "Ack", "Data"], got  # in order: the Upload failed first
    assert bytes(got[-1].data) == x.tobytes()
    err = c.call(m.Read(5, 1))
    assert isinstance(err, m.Error) and err.code == m.MISSING_TENSOR  # nothing of it kept


def test_an_oversized_frame_on_a_bulk_stream_fails_its_upload_at_once(
    server_engine, secure, peers, raw
):
    server = secure("--max-frame", str(MAX_FRAME))
    c = raw(server, peers.attacker, max_frame=4 * MAX_FRAME)
    c.hello()
    sid = _upload_then_more(c, 7)
    c.conn.send_frame(sid, bytes(MAX_FRAME + 1))
    _later_messages_answered(c, "bulk 7", "frame")


def test_a_bulk_stream_the_client_ends_early_fails_its_upload_at_once(
    server_engine, secure, peers, raw
):
    server = secure()
    c = raw(server, peers.attacker)
    c.hello()
    sid = _upload_then_more(c, 9)
    c.conn.send_frame(sid, bytes(m.BULK_CHUNK))
    c.conn.finish(sid)  # half of it, then the end of the stream, on a live connection
    _later_messages_answered(c, "bulk 9", "ended the stream")


def test_an_oversized_first_frame_fails_the_upload_waiting_for_its_stream(
    server_engine, secure, peers, raw
):
    """The stream's header itself is too large: which transfer it was is unknown, so the
    Upload waiting for a stream that never opened fails with it."""
    server = secure("--max-frame", str(MAX_FRAME))
    c = raw(server, peers.attacker, max_frame=4 * MAX_FRAME)
    c.hello()
    c.send(m.Upload(0, 1, "uint8", (2 * m.BULK_CHUNK,), b"", 11))
    sid = c.conn.open_stream()
    c.conn.send_frame(sid, bytes(MAX_FRAME + 1))
    _later_messages_answered(c, "bulk 11", "before its header", "frame")


def test_an_undecodable_header_fails_the_upload_waiting_for_its_stream(
    server_engine, secure, peers, raw
):
    server = secure()
    c = raw(server, peers.attacker)
    c.hello()
    c.send(m.Upload(0, 1, "uint8", (2 * m.BULK_CHUNK,), b"", 12))
    sid = c.conn.open_stream()
    c.conn.send_frame(sid, m.encode(m.Sync(5)))  # a control message, not a Bulk header
    _later_messages_answered(c, "bulk 12", "must start with one Bulk message")
