"""The independent client's findings, one test each, on a server session in memory (the
conformance suite in this folder repeats them against a real server with raw frames)."""

from __future__ import annotations

import hashlib

import msgpack
import numpy as np
from burn_remote.protocol import messages as m
from burn_remote.protocol.graph import Graph, GraphNode
from burn_remote.server._session import Session
from burn_remote.server._state import Limits, ServerState

ADD = Graph(
    inputs=(((2,), "float32"), ((2,), "float32")),
    nodes=(GraphNode("add", (0, 1), (), (((2,), "float32"),)),),
    outputs=(2,),
)
SUM = Graph(  # sum's attributes written in canonical order with the default keepdims
    inputs=(((2, 3), "float32"),),
    nodes=(GraphNode("sum", (0,), (("axes", 0), ("keepdims", False)), (((3,), "float32"),)),),
    outputs=(1,),
)


def _session(limits: Limits | None = None) -> Session:
    s = Session(ServerState("cpu", limits), "a" * 52)
    s.feed_control(m.encode(m.Hello(m.PROTOCOL_VERSION, b"")))
    s.step(0.0)
    return s


def _run(s: Session, *msgs: m.Message | bytes) -> list[m.Message]:
    for one in msgs:
        s.feed_control(one if isinstance(one, bytes) else m.encode(one))
    return [reply for out in s.step(1.0) if isinstance(out, bytes) for reply in m.decode(out)]


def _upload(tid: int, a: np.ndarray) -> m.Upload:
    return m.Upload(0, tid, "float32", a.shape, a.astype(np.float32).tobytes(), 0)


def _errors(replies: list[m.Message]) -> list[m.Error]:
    return [r for r in replies if isinstance(r, m.Error)]


def test_a_wrong_input_shape_is_malformed_not_a_missing_tensor() -> None:
    s = _session()
    digest = bytes.fromhex(ADD.digest())
    replies = _run(
        s,
        _upload(1, np.ones(2)),
        _upload(2, np.ones(3)),
        m.RegisterGraph(1, digest, ADD.encode()),
        m.ExecuteGraph(2, digest, (1, 2), (), (3,), ()),
    )
    (err,) = _errors(replies)
    assert (err.code, err.request_id) == (m.MALFORMED, 2)
    assert "input 1 (tensor 2) is float32[3], the graph wants float32[2]" in err.message


def test_a_refused_registration_names_its_request_id() -> None:
    s = _session()
    (err,) = _errors(_run(s, m.RegisterGraph(7, b"\1" * 32, b"\x94\x01\x90\x90\x90")))
    assert (err.code, err.request_id) == (m.BAD_GRAPH, 7)


def test_one_bad_message_costs_only_itself() -> None:
    s = _session()
    frame = msgpack.packb([[9, 1], [6, 2, "not an id"], [9, 3]])  # Sync, bad Read, Sync
    replies = _run(s, frame)
    assert [type(r).__name__ for r in replies] == ["Ack", "Error", "Ack"]
    assert replies[1].code == m.MALFORMED and replies[1].request_id == 2
    assert "tensor_id" in replies[1].message


def test_equal_graphs_share_one_digest_whatever_their_encoding() -> None:
    s = _session()
    canonical = SUM.encode()
    digest = hashlib.sha256(canonical).digest()
    # The same graph with its attributes reordered and the default keepdims left out.
    loose = msgpack.packb(
        [1, [[[2, 3], "float32"]], [["sum", [0], [["axes", 0]], [[[3], "float32"]]]], [1]]
    )
    assert loose != canonical
    assert not _errors(_run(s, m.RegisterGraph(1, digest, loose)))  # normalised: accepted
    own = hashlib.sha256(loose).digest()  # under the hash of its own bytes: refused
    (err,) = _errors(_run(s, m.RegisterGraph(2, own, loose)))
    assert err.code == m.BAD_GRAPH and "not in canonical form" in err.message
    assert digest.hex() in err.message
    replies = _run(
        s,
        _upload(1, np.arange(6).reshape(2, 3)),
        m.ExecuteGraph(3, digest, (1,), (), (2,), ()),
        m.Read(4, 2),
    )
    assert not _errors(replies)
    assert np.frombuffer(replies[-1].data, np.float32).tolist() == [3.0, 5.0, 7.0]


def test_expose_refuses_a_string_that_is_not_a_peer_id() -> None:
    s = _session()
    (err,) = _errors(_run(s, _upload(1, np.ones(2)), m.Expose(5, 1, "some-server")))
    assert (err.code, err.request_id) == (m.MALFORMED, 5)
    assert "not a peer id" in err.message


def test_a_small_frame_limit_announces_a_bulk_threshold_that_fits() -> None:
    s = Session(ServerState("cpu", Limits(max_frame=100_000)), "a" * 52)
    s.feed_control(m.encode(m.Hello(m.PROTOCOL_VERSION, b"")))
    (welcome,) = m.decode(s.step(0.0)[0])
    assert welcome.limits["bulk_threshold"] < 100_000
    assert welcome.limits["bulk_chunk"] <= 100_000
