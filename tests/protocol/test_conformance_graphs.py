"""Conformance, sections 5 and 6: graphs registered and executed, and how bad ones are
refused. A real server, raw frames (wire.py)."""

from __future__ import annotations

import hashlib

import msgpack
import numpy as np
import pytest

from . import spec
from .wire import ERR, F32, Raw, errors, graph, msg, upload

pytestmark = pytest.mark.timeout(300)


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


def _node_graph(op: str, attrs: list, out: list, **pack: bool) -> bytes:
    """A one-node graph on a float32[2, 3] input, ``attrs`` written in the order given."""
    nodes = [[op, [0] if op != "full" else [], attrs, [out]]]
    inputs = [[[2, 3], F32]] if op != "full" else []
    return msgpack.packb([1, inputs, nodes, [len(inputs)]], use_bin_type=True, **pack)


def test_attributes_are_sorted_by_code_point_and_typed_as_section_5_says(raw: Raw) -> None:
    """Section 5: a graph's digest is over its attributes sorted by the names' code points,
    floats as float64; bytes written otherwise are normalised under that digest, refused
    under their own. Values are nil, int, float, bool, str or arrays of them; a bin or a
    map is BAD_GRAPH naming its node."""
    attrs = [["keepdims", False], ["axes", [0]]]  # not in order
    loose = _node_graph("sum", attrs, [[3], F32])
    canonical = _node_graph("sum", sorted(attrs, key=lambda kv: kv[0].encode()), [[3], F32])
    full = [["value", 0.5], ["shape", [2]], ["dtype", F32]]
    single = _node_graph("full", full, [[2], F32], use_single_float=True)  # 0.5 as float32
    full64 = _node_graph("full", sorted(full, key=lambda kv: kv[0].encode()), [[2], F32])
    for rid, (data, canon) in enumerate([(loose, canonical), (single, full64)], start=1):
        assert data != canon
        digest = hashlib.sha256(canon).digest()
        raw.send(msg("RegisterGraph", rid, digest, data), msg("Sync", 10 + rid))
        assert not errors(raw.replies("Ack"))
        raw.send(msg("RegisterGraph", 20 + rid, hashlib.sha256(data).digest(), data))
        raw.send(msg("Sync", 30 + rid))
        (err,) = errors(raw.replies("Ack"))
        assert (err["code"], err["request_id"]) == (ERR["BAD_GRAPH"], 20 + rid)
        assert digest.hex() in err["message"]
    unset = _node_graph("sum", [["axes", None], ["keepdims", False]], [[], F32])
    raw.send(msg("RegisterGraph", 40, hashlib.sha256(unset).digest(), unset), msg("Sync", 41))
    assert not errors(raw.replies("Ack"))  # nil: axes unset, every axis reduced
    for rid, value in [(50, b"\x00"), (52, {"a": 0})]:  # a bin once passed for axes (0,)
        bad = _node_graph("sum", [["axes", value], ["keepdims", False]], [[3], F32])
        raw.send(msg("RegisterGraph", rid, hashlib.sha256(bad).digest(), bad), msg("Sync", 1))
        (err,) = errors(raw.replies("Ack"))
        assert (err["code"], err["node"], err["request_id"]) == (ERR["BAD_GRAPH"], 0, rid)
        assert "'axes'" in err["message"]


@pytest.mark.parametrize(
    "op,attrs,out",
    [
        # a stop past the axis would make 1000 rows of a 2-row input (read past it)
        ("slice", [["starts", [0, 0]], ["steps", [1, 1]], ["stops", [1000, 3]]], [[1000, 3], F32]),
        ("slice", [["starts", [-5, 0]], ["steps", [1, 1]], ["stops", [2, 3]]], [[7, 3], F32]),
        ("slice", [["starts", [5, 0]], ["steps", [-1, 1]], ["stops", [-1, 3]]], [[6, 3], F32]),
        # a gradient larger than the slice it comes from would be written past in_shape
        (
            "slice_backward",
            [["in_shape", [2, 3]], ["starts", [0, 0]], ["steps", [1, 1]], ["stops", [1, 3]]],
            [[2, 3], F32],
        ),
    ],
)
def test_a_slice_whose_bounds_are_not_clamped_is_bad_graph(raw: Raw, op, attrs, out) -> None:
    """OPS.md's slice rows: bounds lie where ``slice(...).indices(n)`` puts them, and a
    slice_backward's gradient has the shape of that slice; anything else is BAD_GRAPH naming
    the node, never an output larger than what it reads (on a device: a read past a buffer)."""
    data = _node_graph(op, sorted(attrs), out)
    raw.send(msg("RegisterGraph", 7, hashlib.sha256(data).digest(), data), msg("Sync", 8))
    (err,) = errors(raw.replies("Ack"))
    assert (err["code"], err["node"], err["request_id"]) == (ERR["BAD_GRAPH"], 0, 7), err
    assert op in err["message"] and (
        "must lie in" in err["message"] or "gradient" in err["message"]
    )
