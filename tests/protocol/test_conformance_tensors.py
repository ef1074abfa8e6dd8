"""Conformance, sections 3, 4 and 9: tensors uploaded, read, dropped; limits; bulk transfers
on streams of their own. A real server, raw frames (wire.py)."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from .wire import (
    ERR,
    F32,
    MAX_FRAME,
    MAX_TENSORS,
    MSG,
    QUOTA,
    Raw,
    errors,
    frame,
    msg,
    named,
    upload,
)

pytestmark = pytest.mark.timeout(300)


# --- tensors -------------------------------------------------------------------------------
def test_upload_read_sync_drop_and_memory_stats(raw: Raw) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    raw.send(upload(1, x), msg("Read", 1, 1), msg("Sync", 2))
    data, ack = raw.replies("Ack")
    assert (data["name"], data["request_id"], data["dtype"], data["shape"]) == (
        "Data",
        1,
        F32,
        [2, 3],
    )
    assert data["data"] == x.tobytes() and data["bulk_id"] == 0
    assert (ack["name"], ack["request_id"]) == ("Ack", 2)
    raw.send(msg("MemoryStats", 3, 0, 0, 0, 0, 0, 0, 0, 0, 0))
    (stats,) = raw.replies("MemoryStats")
    assert stats["request_id"] == 3 and stats["session_tensors"] == 1
    assert stats["session_bytes"] == x.nbytes and stats["sessions"] >= 1
    raw.send(msg("Drop", [1]), msg("Read", 4, 1))
    (err,) = raw.replies("Error")
    assert (err["code"], err["request_id"]) == (ERR["MISSING_TENSOR"], 4)


def test_a_scalar_is_read_with_shape_empty_alone_or_with_other_messages(raw: Raw) -> None:
    """Data carries the tensor's own dimensions: [] for a 0-d tensor, whether the Read comes
    alone in its frame (the server's fast path) or with other messages."""
    x = np.array(2.5, dtype=np.float32)
    raw.send(msg("Upload", 0, 7, F32, [], x.tobytes(), 0))
    raw.send(msg("Read", 8, 7))
    (alone,) = raw.replies("Data")
    raw.send(msg("Read", 9, 7), msg("Sync", 10))
    together, _ = raw.replies("Ack")
    for data in (alone, together):
        assert (data["dtype"], data["shape"], data["data"]) == (F32, [], x.tobytes())


def test_an_upload_of_the_wrong_size_is_malformed_and_named_by_its_request_id(raw: Raw) -> None:
    raw.send(msg("Upload", 5, 1, F32, [4], b"\0" * 12, 0), msg("Sync", 6))
    err, _ = raw.replies("Ack")
    assert err["code"] == ERR["MALFORMED"] and "needs 16 bytes" in err["message"]
    assert err["request_id"] == 5  # section 4: an Upload's errors name it
    raw.send(msg("Upload", 0, 1, "int3", [4], b"\0" * 16, 0), msg("Sync", 7))
    err, _ = raw.replies("Ack")
    assert (err["code"], err["request_id"]) == (ERR["MALFORMED"], 0)  # 0: none asked


def test_one_bad_message_is_answered_in_its_place(raw: Raw) -> None:
    raw.send(msg("Sync", 1), [MSG["Read"].tag, 2, "not an id"], msg("Sync", 3))
    replies = raw.replies("Ack")
    replies += raw.replies("Ack") if len(replies) < 3 else []
    assert [r["name"] for r in replies] == ["Ack", "Error", "Ack"]
    assert (replies[1]["code"], replies[1]["request_id"]) == (ERR["MALFORMED"], 2)


def test_a_frame_that_is_not_a_batch_is_malformed(raw: Raw) -> None:
    raw.send(raw=msgpack.packb({"not": "a batch"}))
    raw.send(msg("Sync", 1))
    err, ack = raw.replies("Ack")
    assert err["code"] == ERR["MALFORMED"] and err["request_id"] == 0 and ack["request_id"] == 1


def test_too_many_tensors_is_limit(raw: Raw) -> None:
    one = np.ones(1, np.float32)
    raw.send(*[upload(t, one) for t in range(1, MAX_TENSORS + 2)], msg("Sync", 1))
    replies = raw.replies("Ack")
    (err,) = errors(replies)
    assert err["code"] == ERR["LIMIT"] and "max_tensors" in err["message"]


# --- bulk transfers ------------------------------------------------------------------------
def test_bulk_upload_and_read_back_in_acknowledged_chunks(raw: Raw) -> None:
    x = np.random.default_rng(0).standard_normal(3 * 2**20 // 4 + 5).astype(np.float32)
    payload = x.tobytes()
    raw.send(msg("Upload", 0, 1, F32, [x.size], b"", 1))
    sid = raw.conn.open_stream()
    raw.conn.send_frame(sid, frame(msg("Bulk", 1, len(payload), 0)))
    chunk = 2**20
    for start in range(0, len(payload), chunk):
        raw.conn.send_frame(sid, payload[start : start + chunk])
    raw.send(msg("Read", 2, 1))
    (data,) = raw.replies("Data")
    acks = [named(msgpack.unpackb(f, raw=False)[0]) for f in raw.other.get(sid, []) if f]
    assert acks and acks[-1] == {"name": "BulkAck", "bulk_id": 1, "received": len(payload)}
    assert all(a["received"] % (2 * 2**20) == 0 for a in acks[:-1])
    raw.conn.finish(sid)
    assert data["data"] == b"" and data["bulk_id"] > 0 and data["shape"] == [x.size]
    got, stream = _receive_bulk(raw, data["bulk_id"])
    assert got == payload


def _receive_bulk(raw: Raw, bulk_id: int) -> tuple[bytes, int]:
    """Read the server's transfer: header, chunks (BulkAck every 2 MiB and at the end)."""
    buffer, size, stream = bytearray(), None, None
    while size is None or len(buffer) < size:
        while not any(raw.other.get(s) for s in raw.other if s % 2 == 1):
            sid, data = raw.inbox.get(timeout=30)
            raw.other.setdefault(sid, []).append(data)
        for s in [s for s in raw.other if s % 2 == 1 and raw.other[s]]:
            for data in raw.other.pop(s):
                if data is None:
                    continue
                if size is None:
                    header = named(msgpack.unpackb(data, raw=False)[0])
                    assert header["name"] == "Bulk" and header["bulk_id"] == bulk_id
                    size, stream = header["size"], s
                else:
                    buffer += data
            raw.other[s] = []
    assert stream is not None
    raw.conn.send_frame(stream, frame(msg("BulkAck", bulk_id, size)))
    return bytes(buffer), stream


def test_a_transfer_over_the_memory_quota_is_limit_and_nothing_is_kept(raw: Raw) -> None:
    size = QUOTA + 4
    raw.send(msg("Upload", 0, 1, F32, [size // 4], b"", 1))
    sid = raw.conn.open_stream()
    raw.conn.send_frame(sid, frame(msg("Bulk", 1, size, 0)))
    raw.send(msg("MemoryStats", 2, 0, 0, 0, 0, 0, 0, 0, 0, 0))
    replies = raw.replies("MemoryStats")
    (err,) = errors(replies)
    assert err["code"] == ERR["LIMIT"] and "quota" in err["message"]
    assert replies[-1]["session_bytes"] == 0
    # MemoryStats.room: the session has its whole quota again, and the session quota binds
    assert (replies[-1]["room"], replies[-1]["room_limit"]) == (QUOTA, 1)


def test_an_oversized_control_frame_is_limit_then_the_connection_ends(raw: Raw) -> None:
    raw.send(raw=frame(msg("Upload", 0, 1, "uint8", [MAX_FRAME], b"\0" * MAX_FRAME, 0)))
    (err,) = raw.replies("Error")
    assert err["code"] == ERR["LIMIT"] and err["request_id"] == 0
    assert isinstance(raw.closed.get(timeout=30), Exception)
