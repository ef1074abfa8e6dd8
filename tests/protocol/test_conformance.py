"""Conformance: a real `burn-remote serve` driven with raw frames built only from the tables
of protocol/README.md (tests/protocol/spec.py reads them). Nothing of the client is used:
messages are msgpack arrays written here, over the transport's QUIC connection. Every
message, every error code a client can provoke, and the limits."""

from __future__ import annotations

import hashlib
import os
import queue
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from burn_remote.protocol.transport import BlockingConnection, EndpointConfig, Identity
from burn_remote.server.testing import Daemon, start_server

from . import spec

pytestmark = pytest.mark.timeout(300)

MSG = spec.messages()
ERR = spec.errors()
TAG_NAME = {s.tag: name for name, s in MSG.items()}
MAX_FRAME = 2 * 2**20
QUOTA = 32 * 2**20
MAX_TENSORS = 100
VERSION = 4
F32 = "float32"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("conformance")
    daemon = start_server(
        tmp / "server",
        "--max-frame", str(MAX_FRAME), "--session-memory", str(QUOTA),
        "--max-tensors", str(MAX_TENSORS), "--idle-timeout", "2", "--resume-grace", "30",
    )  # fmt: skip
    yield daemon
    assert daemon.stop() == 0, daemon.output()


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

    def __init__(self, server: Daemon, key: Path) -> None:
        host, port = server.address.rsplit(":", 1)
        self.inbox: queue.Queue[tuple[int, bytes | None]] = queue.Queue()
        self.closed: queue.Queue[Exception] = queue.Queue()
        self.conn = BlockingConnection.connect(
            Identity.load_or_create(key),
            server.peer_id,
            (host, int(port)),
            on_frame=lambda sid, f: self.inbox.put((sid, f)),
            on_closed=self.closed.put,
            config=EndpointConfig(max_frame_size=64 * 2**20),
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


@pytest.fixture
def raw(server: Daemon, tmp_path: Path) -> Iterator[Raw]:
    client = Raw(server, tmp_path / "key")
    client.hello()
    yield client
    client.close()


def errors(replies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in replies if r["name"] == "Error"]


def upload(tid: int, a: np.ndarray) -> list[Any]:
    a = np.asarray(a, order="C")  # keeps a 0-d array 0-d (ascontiguousarray makes it 1-d)
    return msg("Upload", 0, tid, str(a.dtype), list(a.shape), a.tobytes(), 0)


def graph(inputs: list, nodes: list, outputs: list) -> tuple[bytes, bytes]:
    """A graph encoded per section 5, and its digest."""
    data = msgpack.packb([1, inputs, nodes, outputs], use_bin_type=True)
    return data, hashlib.sha256(data).digest()


# --- session ---------------------------------------------------------------------------------
def test_hello_is_answered_by_a_welcome_with_every_documented_field(
    server: Daemon, tmp_path: Path
) -> None:
    client = Raw(server, tmp_path / "key")
    welcome = client.hello()
    assert welcome["version"] == VERSION and welcome["server_peer_id"] == server.peer_id
    assert isinstance(welcome["session_id"], int) and len(welcome["resume_token"]) == 16
    assert set(welcome["limits"]) >= {
        "max_frame", "max_tensors", "max_graphs", "session_memory", "bulk_threshold",
        "bulk_chunk", "resume_grace_ms",
    }  # fmt: skip
    assert welcome["limits"]["max_frame"] == MAX_FRAME
    assert welcome["limits"]["bulk_threshold"] <= MAX_FRAME // 2
    assert welcome["limits"]["bulk_chunk"] <= MAX_FRAME
    assert welcome["limits"]["resume_grace_ms"] == 30_000
    assert isinstance(welcome["extensions"], dict) and welcome["extensions"]
    client.close()


def test_another_version_gets_version_and_the_connection_ends(
    server: Daemon, tmp_path: Path
) -> None:
    client = Raw(server, tmp_path / "key")
    client.send(msg("Hello", 1, b"", {}))
    (err,) = client.replies("Error")
    assert err["code"] == ERR["VERSION"]
    assert "client speaks protocol version 1" in err["message"]
    assert f"this server version {VERSION}" in err["message"]
    assert isinstance(client.closed.get(timeout=30), Exception)


def test_anything_before_hello_is_malformed(server: Daemon, tmp_path: Path) -> None:
    client = Raw(server, tmp_path / "key")
    client.send(msg("Sync", 1))
    (err,) = client.replies("Error")
    assert err["code"] == ERR["MALFORMED"] and "Hello" in err["message"]
    client.close()


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
    raw.send(msg("MemoryStats", 3, 0, 0, 0, 0, 0, 0, 0))
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


# --- graphs --------------------------------------------------------------------------------
def test_the_worked_example_registers_and_executes(raw: Raw) -> None:
    data, digest = spec.worked_example()
    x = np.array([1.5, -2.0], np.float32)
    raw.send(
        upload(1, x),
        msg("RegisterGraph", 1, bytes.fromhex(digest), data),
        msg("ExecuteGraph", 2, bytes.fromhex(digest), [1], [3.0], [2], [1]),
        msg("Read", 3, 2),
        msg("Read", 4, 1),
    )
    replies = raw.replies("Error")  # the dropped input is gone
    data_reply = replies[0]
    assert np.frombuffer(data_reply["data"], np.float32).tolist() == [4.5, -6.0]
    assert (replies[-1]["code"], replies[-1]["request_id"]) == (ERR["MISSING_TENSOR"], 4)


def test_an_output_id_that_is_an_input_id_replaces_it_in_place_or_is_gone_on_failure(
    raw: Raw,
) -> None:
    data, digest = spec.worked_example()  # y = x * s
    d = bytes.fromhex(digest)
    x = np.array([1.5, -2.0], np.float32)
    raw.send(
        upload(1, x),
        msg("RegisterGraph", 1, d, data),
        msg("ExecuteGraph", 2, d, [1], [3.0], [1], []),  # x = x * 3, under the same id
        msg("ExecuteGraph", 3, d, [1], [-1.0], [1], []),
        msg("Read", 4, 1),
    )
    (reply,) = raw.replies("Data")
    assert np.frombuffer(reply["data"], np.float32).tolist() == [-4.5, 6.0]
    nodes = [["index_select", [0, 1], [["axis", 0]], [[[1], F32]]]]
    gather, gather_digest = graph([[[3], F32], [[1], "int64"]], nodes, [2])
    raw.send(
        upload(5, np.ones(3, np.float32)),
        upload(6, np.array([7], np.int64)),  # out of range: fails when it runs
        msg("RegisterGraph", 5, gather_digest, gather),
        msg("ExecuteGraph", 6, gather_digest, [5, 6], [], [5], []),
        msg("Read", 7, 5),
        msg("Read", 8, 6),
    )
    replies = raw.replies("Data")
    assert [(r["name"], r.get("code"), r["request_id"]) for r in replies] == [
        ("Error", ERR["EXECUTION"], 6),
        ("Error", ERR["MISSING_TENSOR"], 7),  # gone, not half-written
        ("Data", None, 8),  # an input it does not write is kept
    ]


def test_a_non_canonical_encoding_is_normalised_or_refused_naming_the_canonical_digest(
    raw: Raw,
) -> None:
    canonical, digest = spec.worked_example()
    loose = canonical[:-1] + b"\xcc\x02"  # outputs [2] with 2 as a uint8, not a fixint
    assert loose != canonical
    raw.send(msg("RegisterGraph", 1, bytes.fromhex(digest), loose), msg("Sync", 2))
    assert not errors(raw.replies("Ack"))  # accepted under the canonical digest
    own = hashlib.sha256(loose).digest()
    raw.send(msg("RegisterGraph", 3, own, loose), msg("Sync", 4))
    (err,) = errors(raw.replies("Ack"))
    assert (err["code"], err["request_id"]) == (ERR["BAD_GRAPH"], 3)
    assert digest in err["message"]


def test_a_bad_graph_is_refused_with_its_request_id(raw: Raw) -> None:
    data, digest = graph([[[2], F32]], [["no_such_op", [0], [], [[[2], F32]]]], [1])
    raw.send(
        msg("RegisterGraph", 5, digest, data), msg("ExecuteGraph", 6, digest, [1], [], [2], [])
    )
    raw.send(msg("Sync", 7))
    replies = raw.replies("Ack")
    assert [(e["code"], e["request_id"]) for e in errors(replies)] == [
        (ERR["BAD_GRAPH"], 5),
        (ERR["BAD_GRAPH"], 6),  # executing a refused digest fails the same way
    ]


def test_wrong_bindings_are_malformed(raw: Raw) -> None:
    data, digest = spec.worked_example()
    digest_b = bytes.fromhex(digest)
    raw.send(upload(1, np.ones(3, np.float32)), msg("RegisterGraph", 1, digest_b, data))
    raw.send(msg("ExecuteGraph", 2, digest_b, [1], [2.0], [2], []))  # x is float32[3], not [2]
    raw.send(msg("ExecuteGraph", 3, digest_b, [1], [], [2], []))  # the value is not bound
    raw.send(msg("Sync", 4))
    replies = raw.replies("Ack")
    assert [(e["code"], e["request_id"]) for e in errors(replies)] == [
        (ERR["MALFORMED"], 2),
        (ERR["MALFORMED"], 3),
    ]


def test_a_failing_kernel_is_execution_naming_the_node(raw: Raw) -> None:
    nodes = [["index_select", [0, 1], [["axis", 0]], [[[1], F32]]]]
    data, digest = graph([[[3], F32], [[1], "int64"]], nodes, [2])
    raw.send(
        upload(1, np.ones(3, np.float32)),
        upload(2, np.array([7], np.int64)),  # out of range
        msg("RegisterGraph", 1, digest, data),
        msg("ExecuteGraph", 2, digest, [1, 2], [], [3], []),
        msg("Sync", 3),
    )
    (err,) = errors(raw.replies("Ack"))
    assert (err["code"], err["node"], err["request_id"]) == (ERR["EXECUTION"], 0, 2)


def test_an_unknown_digest_stalls_until_resync(raw: Raw) -> None:
    data, digest = spec.worked_example()
    digest_b = bytes.fromhex(digest[::-1])  # a digest the server never saw
    raw.send(
        upload(1, np.ones(2, np.float32)), msg("ExecuteGraph", 1, digest_b, [1], [2.0], [2], [])
    )
    raw.send(msg("Sync", 2))
    replies = raw.replies("Error")
    replies += raw.replies("Error") if len(errors(replies)) < 2 else []
    assert [(e["code"], e["request_id"]) for e in errors(replies)] == [
        (ERR["UNKNOWN_GRAPH"], 1),
        (ERR["STALLED"], 2),
    ]
    real = bytes.fromhex(digest)
    raw.send(
        msg("Resync"),
        msg("RegisterGraph", 3, real, data),
        msg("ExecuteGraph", 4, real, [1], [2.0], [2], []),
        msg("Read", 5, 2),
    )
    (value,) = raw.replies("Data")
    assert np.frombuffer(value["data"], np.float32).tolist() == [2.0, 2.0]


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
    raw.send(msg("MemoryStats", 2, 0, 0, 0, 0, 0, 0, 0))
    replies = raw.replies("MemoryStats")
    (err,) = errors(replies)
    assert err["code"] == ERR["LIMIT"] and "quota" in err["message"]
    assert replies[-1]["session_bytes"] == 0


def test_an_oversized_control_frame_is_limit_then_the_connection_ends(raw: Raw) -> None:
    raw.send(raw=frame(msg("Upload", 0, 1, "uint8", [MAX_FRAME], b"\0" * MAX_FRAME, 0)))
    (err,) = raw.replies("Error")
    assert err["code"] == ERR["LIMIT"] and err["request_id"] == 0
    assert isinstance(raw.closed.get(timeout=30), Exception)


# --- capabilities --------------------------------------------------------------------------
def test_expose_gives_a_token_and_refuses_what_is_not_a_peer_id(raw: Raw) -> None:
    raw.send(upload(1, np.ones(2, np.float32)), msg("Expose", 1, 1, "a" * 52))
    (token,) = raw.replies("Token")
    assert token["request_id"] == 1 and len(token["token"]) == 32
    raw.send(msg("Expose", 2, 1, "some-server"))
    (err,) = raw.replies("Error")
    assert (err["code"], err["request_id"]) == (ERR["MALFORMED"], 2)


def test_a_fetch_with_a_token_nobody_granted_is_capability(raw: Raw, server: Daemon) -> None:
    server.know(server)  # the source (here itself) must be in the server's own address book
    raw.send(msg("Fetch", 9, server.peer_id, "", os.urandom(32)), msg("Sync", 1))
    err, _ = raw.replies("Ack", timeout=60)
    assert err["code"] == ERR["CAPABILITY"]
    raw.send(msg("Read", 2, 9))
    (missing,) = raw.replies("Error")
    assert missing["code"] == ERR["MISSING_TENSOR"]  # nothing was stored


def test_a_fetch_naming_an_address_is_forbidden(raw: Raw, server: Daemon) -> None:
    raw.send(msg("Fetch", 9, server.peer_id, server.address, os.urandom(32)), msg("Sync", 1))
    err, _ = raw.replies("Ack")
    assert err["code"] == ERR["FORBIDDEN"] and "source_address" in err["message"]


def test_a_fetch_from_a_peer_the_server_cannot_resolve_is_capability(raw: Raw) -> None:
    stranger = str(Identity.generate().peer_id)
    raw.send(msg("Fetch", 9, stranger, "", os.urandom(32)), msg("Sync", 1))
    err, _ = raw.replies("Ack", timeout=60)
    assert err["code"] == ERR["CAPABILITY"] and "knows no address" in err["message"]


# --- jobs and artifacts --------------------------------------------------------------------
def test_job_messages_and_artifacts(raw: Raw) -> None:
    blob = os.urandom(100_000)
    digest = hashlib.sha256(blob).digest()
    raw.send(
        msg("ArtifactPut", 1, digest, 0, len(blob), blob[:60_000]),
        msg("ArtifactPut", 2, digest, 60_000, len(blob), blob[60_000:]),
        msg("ArtifactGet", 3, digest, 0, 2**20),
    )
    replies = raw.replies("ArtifactChunk")
    assert [r["name"] for r in replies] == ["Ack", "Ack", "ArtifactChunk"]
    assert replies[2]["data"] == blob and replies[2]["total"] == len(blob)
    bad = hashlib.sha256(b"other").digest()
    raw.send(msg("ArtifactPut", 4, bad, 0, 5, b"hello"))
    (err,) = raw.replies("Error")
    assert (err["code"], err["request_id"]) == (ERR["JOB"], 4)
    raw.send(msg("JobSubmit", 5, b'{"kind": "lora", "lora": {"r": "8x"}}'))
    (err,) = raw.replies("Error")
    assert err["code"] == ERR["JOB"] and err["request_id"] == 5
    raw.send(msg("JobList", 6, 0, 10))
    (info,) = raw.replies("JobInfo")
    assert info["request_id"] == 6 and isinstance(info["info"], bytes)
    for name in ("JobStatus", "JobCancel"):
        raw.send(msg(name, 7, 424242))
        (err,) = raw.replies("Error")
        assert (err["code"], err["request_id"]) == (ERR["JOB"], 7)
    raw.send(msg("JobWatch", 8, 424242, 0))
    (err,) = raw.replies("Error")
    assert (err["code"], err["request_id"]) == (ERR["JOB"], 8)


def test_server_status_is_forbidden_to_other_peers(raw: Raw) -> None:
    raw.send(msg("ServerStatus", 1))
    (err,) = raw.replies("Error")
    assert (err["code"], err["request_id"]) == (ERR["FORBIDDEN"], 1)


# --- resume --------------------------------------------------------------------------------
_SEQ = struct.Struct(">BQQ")


def _wrap(seq: int, ack: int, inner: bytes) -> bytes:
    return _SEQ.pack(0xC1, seq, ack) + inner


def _unwrap(data: bytes) -> tuple[int, int, list[dict[str, Any]]]:
    magic, seq, ack = _SEQ.unpack_from(data)
    assert magic == 0xC1
    return seq, ack, [named(m) for m in msgpack.unpackb(data[_SEQ.size :], raw=False)]


def test_a_session_resumes_with_a_full_welcome_and_an_unknown_token_expires(
    server: Daemon, tmp_path: Path
) -> None:
    key = tmp_path / "key"
    first = Raw(server, key)
    first.send(raw=_wrap(1, 0, frame(msg("Hello", VERSION, b"", {}))))
    _, _, (welcome,) = _unwrap(next(first.frames()))
    first.send(raw=_wrap(2, 1, frame(upload(1, np.full(2, 7, np.float32)))))
    first.send(raw=_wrap(3, 1, frame(msg("Sync", 1))))
    assert _unwrap(next(first.frames()))[2][0]["name"] == "Ack"
    first.conn.close("cut", flush_timeout=0)  # no goodbye: the server parks the session

    again = Raw(server, key)
    hello = msg("Hello", VERSION, welcome["resume_token"], {})
    again.send(raw=_wrap(0, 2, frame(hello)))
    seq, ack, (resumed,) = _unwrap(next(again.frames()))
    assert (seq, ack, resumed["name"]) == (0, 3, "Welcome")
    assert resumed["session_id"] == welcome["session_id"]
    assert resumed["resume_token"] == welcome["resume_token"]  # section 10: the same token
    assert resumed["extensions"] == welcome["extensions"] and resumed["limits"] == welcome["limits"]
    again.send(raw=_wrap(4, 2, frame(msg("Read", 2, 1))))
    (data,) = _unwrap(next(again.frames()))[2]
    assert np.frombuffer(data["data"], np.float32).tolist() == [7.0, 7.0]
    again.close()

    stranger = Raw(server, tmp_path / "other-key")
    stranger.send(raw=_wrap(0, 0, frame(msg("Hello", VERSION, os.urandom(16), {}))))
    (err,) = _unwrap(next(stranger.frames()))[2]
    assert err["code"] == ERR["SESSION_EXPIRED"]


# --- device groups (section 11) ------------------------------------------------------------------
GROUP_PREFIX = r"group (?P<group>[0-9a-f]{16}): rank (?P<rank>-?\d+) \((?P<peer>[^)]*)\): "
"""The start of an Error(GROUP) message, as section 6 writes it."""


def test_a_one_rank_group_all_reduces_inside_a_graph(raw: Raw, server: Daemon) -> None:
    import re

    gid = 0x1234
    raw.send(msg("GroupSetup", 1, gid, 0, [server.peer_id], os.urandom(32), 5000))
    (ready,) = raw.replies("GroupReady")
    assert (ready["request_id"], ready["device"]) == (1, "cpu")
    raw.send(msg("GroupStart", 2, gid, "ring"))
    (ack,) = raw.replies("Ack")
    assert ack["request_id"] == 2
    nodes = [["all_reduce", [0], [["group", gid], ["op", "mean"]], [[[3], F32]]]]
    data, digest = graph([[[3], F32]], nodes, [1])
    x = np.array([1.0, -2.0, 3.5], np.float32)
    raw.send(
        upload(1, x),
        msg("RegisterGraph", 3, digest, data),
        msg("ExecuteGraph", 4, digest, [1], [], [2], []),
        msg("Read", 5, 2),
    )
    (data_reply,) = raw.replies("Data")
    assert np.frombuffer(data_reply["data"], np.float32).tolist() == x.tolist()
    raw.send(msg("GroupClose", gid), msg("ExecuteGraph", 6, digest, [1], [], [3], []))
    raw.send(msg("Sync", 7))
    (err,) = errors(raw.replies("Ack"))
    assert (err["code"], err["node"], err["request_id"]) == (ERR["GROUP"], 0, 6)
    found = re.match(GROUP_PREFIX, err["message"])
    assert found and found["group"] == f"{gid:016x}" and found["rank"] == "-1", err


def test_group_setup_refusals_are_group(raw: Raw, server: Daemon) -> None:
    other = str(Identity.generate().peer_id)
    raw.send(
        msg("GroupSetup", 1, 5, 0, [other, server.peer_id], os.urandom(32), 1000),  # not it
        msg("GroupSetup", 2, 6, 0, [server.peer_id, server.peer_id], os.urandom(32), 1000),
        msg("GroupSetup", 3, 7, 0, [server.peer_id], os.urandom(31), 1000),  # short capability
        msg("GroupStart", 4, 99, "ring"),  # never set up
        msg("Sync", 5),
    )
    errs = errors(raw.replies("Ack"))
    assert [(e["code"], e["request_id"]) for e in errs] == [(ERR["GROUP"], r) for r in (1, 2, 3, 4)]
    assert "not this server" in errs[0]["message"] and "twice" in errs[1]["message"]


def _ring_hello(
    host: str, port: int, gid: int, rank: int, key: bytes, mode: bytes = b"\x00", offer: bytes = b""
) -> bytes | None:
    """§12's TCP data-plane hello, written from the spec (and a mode-2 ``offer`` after it):
    what the successor's sealed answer opens to, or None if it closed the connection."""
    import socket

    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    aead, aad = AESGCM(key), gid.to_bytes(8, "big")
    hello = aead.encrypt(bytes(4) + bytes(8), b"ring data link" + mode, aad)
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(b"burnring" + struct.pack(">QQ", gid, rank) + hello + offer)
        answer = b""
        while len(answer) < len(hello):
            try:
                more = sock.recv(len(hello) - len(answer))
            except ConnectionResetError:  # closed with our bytes unread
                return None
            if not more:
                return None
            answer += more
    return aead.decrypt((1).to_bytes(4, "big") + bytes(8), answer, aad)


def _group_with_a_neighbour(
    raw: Raw, server: Daemon, tmp_path: Path, gid: int
) -> tuple[Path, str, bytes]:
    """GroupSetup of the server as rank 0 and a neighbour (rank 1) the test plays: the
    neighbour's key file, its peer id and the group's capability."""
    neighbour_key = tmp_path / "neighbour"
    neighbour = str(Identity.load_or_create(neighbour_key).peer_id)
    cap = os.urandom(32)
    raw.send(msg("GroupSetup", 1, gid, 0, [server.peer_id, neighbour], cap, 5000))
    raw.replies("GroupReady")
    return neighbour_key, neighbour, cap


def test_a_group_link_needs_the_capability_and_the_right_rank(
    raw: Raw, server: Daemon, tmp_path: Path
) -> None:
    gid = 0x77
    neighbour_key, neighbour, cap = _group_with_a_neighbour(raw, server, tmp_path, gid)
    wrong = Raw(server, neighbour_key)
    wrong.send(msg("GroupLink", VERSION, gid, 1, os.urandom(32), "", b""))
    (err,) = wrong.replies("Error")
    assert err["code"] == ERR["CAPABILITY"] and "capability" in err["message"]
    right = Raw(server, neighbour_key)
    right.send(msg("GroupLink", VERSION, gid, 1, cap, "", b""))
    (answer,) = right.replies("GroupLink")
    assert (answer["group_id"], answer["rank"], answer["capability"]) == (gid, 0, b"")
    assert answer["ring_address"].startswith(":") and len(answer["ring_key"]) == 32
    port = int(answer["ring_address"][1:])
    host = server.address.rsplit(":", 1)[0]
    key = answer["ring_key"]
    assert _ring_hello(host, port, gid, 1, os.urandom(32)) is None  # another key: closed
    assert _ring_hello(host, port, gid, 1, key) == b"ring data link\x00"  # sealed records
    # the link is up (one per group link): a second hello is refused, plain or not
    assert _ring_hello(host, port, gid, 1, key, b"\x01") is None
    right.send(msg("GroupBeat", gid, 0, 0))
    # the server must dial its successor (rank 1) itself: it knows no address for it
    raw.send(msg("GroupStart", 2, gid, "ring"))
    (err,) = errors(raw.replies("Error", timeout=60))
    assert err["code"] == ERR["GROUP"] and f"rank 1 ({neighbour})" in err["message"]
    right.close()


def _shared_segment(nonce: bytes) -> int:
    """§12 mode 2's segment, from the spec: a memfd of 4096 + 16 MiB bytes, the nonce
    first, sealed against resizing."""
    import fcntl

    fd = os.memfd_create("conformance", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, 4096 + 16 * 2**20)
    os.pwrite(fd, nonce, 0)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    return fd


@pytest.mark.parametrize("nonce_right", [True, False], ids=["segment", "wrong-nonce"])
def test_a_same_host_dialler_may_offer_shared_memory(
    raw: Raw, server: Daemon, tmp_path: Path, nonce_right: bool
) -> None:
    """§12 mode 2: a loopback dialler offering its sealed memfd (pid, fd, nonce after the
    hello) is answered 2; an offer whose segment does not hold that nonce is answered 1
    (plain TCP), not refused."""
    gid = 0x79 if nonce_right else 0x7A
    neighbour_key, _, cap = _group_with_a_neighbour(raw, server, tmp_path, gid)
    right = Raw(server, neighbour_key)
    right.send(msg("GroupLink", VERSION, gid, 1, cap, "", b""))
    (answer,) = right.replies("GroupLink")
    port = int(answer["ring_address"][1:])
    host = server.address.rsplit(":", 1)[0]
    nonce = os.urandom(16)
    fd = _shared_segment(nonce)
    try:
        offer = struct.pack(">II", os.getpid(), fd) + (nonce if nonce_right else os.urandom(16))
        opened = _ring_hello(host, port, gid, 1, answer["ring_key"], b"\x02", offer)
    finally:
        os.close(fd)
    assert opened == b"ring data link" + (b"\x02" if nonce_right else b"\x01")
    right.close()


def test_a_group_link_of_another_version_is_version_and_fails_the_group_naming_both(
    raw: Raw, server: Daemon, tmp_path: Path
) -> None:
    """§4.1: version 2's GroupLink (no version field) and a later version's (its version
    first) are both answered VERSION naming the two versions; the group fails at once."""
    gid = 0x78
    neighbour_key, neighbour, cap = _group_with_a_neighbour(raw, server, tmp_path, gid)
    later = Raw(server, neighbour_key)
    later.send([MSG["GroupLink"].tag, VERSION + 1, gid, 1, cap, "", b"", "a field of v4"])
    (err,) = later.replies("Error")
    assert err["code"] == ERR["VERSION"]
    assert (
        f"successor speaks protocol version {VERSION}, the dialler {VERSION + 1}"
        in (err["message"])
    )
    old = Raw(server, neighbour_key)
    old.send([MSG["GroupLink"].tag, gid, 1, cap, "", b""])  # version 2's five fields
    (err,) = old.replies("Error")
    assert err["code"] == ERR["VERSION"] and "the dialler 2" in err["message"]
    raw.send(msg("GroupStart", 2, gid, "ring"))
    (err,) = errors(raw.replies("Error", timeout=60))
    assert err["code"] == ERR["GROUP"] and f"rank 1 ({neighbour})" in err["message"]
    assert f"protocol version {VERSION + 1}, this server version {VERSION}" in err["message"]


@pytest.mark.parametrize(
    "inner",
    [b"\x92\x01", frame(msg("Hello", VERSION, b"", {})), frame(msg("Sync", 1))],
    ids=["undecodable", "hello-without-token", "not-hello"],
)
def test_a_first_frame_with_seq_0_that_is_no_resume_is_answered_malformed(
    server: Daemon, tmp_path: Path, inner: bytes
) -> None:
    """Section 10: seq 0 marks an uncounted frame; a session's first frame is seq 1, or a
    seq 0 Hello with a resume token. Anything else first gets Error(MALFORMED) (section 2),
    in a seq 0 frame, and the connection ends."""
    client = Raw(server, tmp_path / "key")
    client.send(raw=_wrap(0, 0, inner))
    seq, _ack, (err,) = _unwrap(next(client.frames()))
    assert (seq, err["name"], err["code"], err["request_id"]) == (0, "Error", ERR["MALFORMED"], 0)
    assert "seq 1" in err["message"]
    assert isinstance(client.closed.get(timeout=10), Exception)


# --- gaps of the spec closed (issue 38) ------------------------------------------------------
def test_a_counted_hello_with_a_token_opens_a_new_session(server: Daemon, tmp_path: Path) -> None:
    """Section 10: a token is read only from a seq 0 Hello; in a counted frame (seq 1) it is
    ignored and the Hello opens a new session."""
    client = Raw(server, tmp_path / "key")
    client.send(raw=_wrap(1, 0, frame(msg("Hello", VERSION, os.urandom(16), {}))))
    seq, ack, (welcome,) = _unwrap(next(client.frames()))
    assert (seq, ack, welcome["name"]) == (1, 1, "Welcome")
    assert len(welcome["resume_token"]) == 16
    client.close()


def test_a_seq_0_frame_with_an_empty_array_only_acknowledges(
    server: Daemon, tmp_path: Path
) -> None:
    """Section 10: a seq 0 frame whose inner frame is an empty array (0x90) carries only its
    ack; the session goes on (an empty inner frame would be the goodbye)."""
    client = Raw(server, tmp_path / "key")
    client.send(raw=_wrap(1, 0, frame(msg("Hello", VERSION, b"", {}))))
    next(client.frames())
    client.send(raw=_wrap(0, 1, b"\x90"))
    client.send(raw=_wrap(2, 1, frame(msg("Sync", 1))))
    seq, ack, (reply,) = _unwrap(next(client.frames()))
    assert (seq, ack, reply["name"], reply["request_id"]) == (2, 2, "Ack", 1)
    client.close()


def test_hello_extension_versions_are_strings(server: Daemon, tmp_path: Path) -> None:
    """Section 4: ``extensions`` maps str to str; another type of version is MALFORMED."""
    client = Raw(server, tmp_path / "key")
    client.send(msg("Hello", VERSION, b"", {"demo": 1}))
    (err,) = client.replies("Error")
    assert err["code"] == ERR["MALFORMED"]
    client.close()
    ok = Raw(server, tmp_path / "key2")
    welcome = ok.hello()
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in welcome["extensions"].items())
    ok.close()


def test_bad_graph_names_the_node_that_failed_validation(raw: Raw) -> None:
    """Section 6: BAD_GRAPH's ``node`` is the index of the node that failed validation, -1
    for a failure that is no node's (here: the format)."""
    data, digest = graph(
        [[[2], F32]], [["neg", [0], [], [[[2], F32]]], ["no_such_op", [1], [], [[[2], F32]]]], [2]
    )
    raw.send(msg("RegisterGraph", 1, digest, data), msg("Sync", 2))
    (err,) = errors(raw.replies("Ack"))
    assert (err["code"], err["node"], err["request_id"]) == (ERR["BAD_GRAPH"], 1, 1)
    bad = msgpack.packb([9, [], [], []], use_bin_type=True)
    raw.send(msg("RegisterGraph", 3, hashlib.sha256(bad).digest(), bad), msg("Sync", 4))
    (err,) = errors(raw.replies("Ack"))
    assert (err["code"], err["node"], err["request_id"]) == (ERR["BAD_GRAPH"], -1, 3)


def test_artifact_get_sends_at_most_one_artifact_chunk(raw: Raw) -> None:
    """Section 8: an ArtifactGet answers at most ARTIFACT_CHUNK (1 MiB) bytes whatever
    ``length`` asks; the client asks again from where the chunk ended."""
    chunk = 2**20
    blob = os.urandom(chunk + chunk // 2)
    digest = hashlib.sha256(blob).digest()
    raw.send(
        msg("ArtifactPut", 1, digest, 0, len(blob), blob[:chunk]),
        msg("ArtifactPut", 2, digest, chunk, len(blob), blob[chunk:]),
        msg("ArtifactGet", 3, digest, 0, len(blob)),
    )
    first = raw.replies("ArtifactChunk")[-1]
    assert (len(first["data"]), first["offset"], first["total"]) == (chunk, 0, len(blob))
    raw.send(msg("ArtifactGet", 4, digest, chunk, len(blob)))
    (rest,) = raw.replies("ArtifactChunk")
    assert first["data"] + rest["data"] == blob
    raw.send(msg("ArtifactPut", 5, digest, 0, len(blob), bytes(chunk + 1)))
    (err,) = raw.replies("Error")
    assert (err["code"], err["request_id"]) == (ERR["JOB"], 5) and str(chunk) in err["message"]


def test_server_status_has_the_documented_limits_and_traffic(server: Daemon) -> None:
    """Section 4: StatusInfo's JSON ``limits`` and ``traffic`` keys (the server's own key
    is an admin)."""
    import json

    admin = Raw(server, server.data_dir / "key")
    admin.hello()
    admin.send(msg("ServerStatus", 1))
    (info,) = admin.replies("StatusInfo")
    status = json.loads(info["info"])
    assert set(status["limits"]) == {"max_sessions", "session_memory", "memory_limit"}
    assert set(status["traffic"]) == {"steps", "bytes_received", "bytes_sent", "messages"}
    assert all(isinstance(v, int) for v in status["traffic"].values())
    admin.close()


def test_a_job_list_page_is_json_with_jobs_and_next(raw: Raw) -> None:
    """Section 8: JobList's JobInfo holds {"jobs": [...], "next": id or null}."""
    import json

    raw.send(msg("JobList", 1, 0, 0))
    (info,) = raw.replies("JobInfo")
    page = json.loads(info["info"])
    assert set(page) == {"jobs", "next"} and page["next"] is None
    assert isinstance(page["jobs"], list)
