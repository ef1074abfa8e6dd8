"""Each bad input the issue lists is answered with a named error code (never INTERNAL),
loses nothing already accepted, and leaves the server up for everyone."""

from __future__ import annotations

import hashlib
import json

import msgpack
from burn_remote.protocol import messages as m
from burn_remote.protocol.graph import GRAPH_FORMAT


def _error(replies: list, code: int, *words: str) -> m.Error:
    errors = [r for r in replies if isinstance(r, m.Error)]
    assert errors, replies
    err = errors[0]
    assert err.code == code, err
    assert err.code != m.INTERNAL
    for w in words:
        assert w in err.message, err.message
    return err


def test_bad_inputs_get_named_errors(server_engine, secure, peers, raw, guard_of):
    server = secure()
    guard = guard_of(server, peers.victim)
    c = raw(server, peers.attacker)
    c.hello()
    ok = m.Upload(0, 1, "float32", (2,), b"\0" * 8, 0)
    c.send(ok, m.Sync(1))
    assert c.replies() == [m.Ack(1)]

    # a shape whose product wraps past 2**64 to exactly the bytes sent (0)
    c.send(m.Upload(0, 2, "float32", (2**32, 2**32, 4), b"", 0), m.Sync(2))
    _error(c.replies(), m.MALFORMED, "too large")

    # a graph input of 2**62 elements
    raw_graph = msgpack.packb([GRAPH_FORMAT, [[[2**62], "float32"]], [], [0]])
    digest = hashlib.sha256(raw_graph).digest()
    c.send(m.RegisterGraph(3, digest, raw_graph), m.Sync(3))
    _error(c.replies(), m.BAD_GRAPH, "elements")

    # a job spec nested 100 000 deep, and one naming `job:<30 digits>` / a NUL in a path
    _error([c.call(m.JobSubmit(4, b"[" * 100_000 + b"]" * 100_000))], m.JOB, "nested")
    for ref, words in (("job:" + "9" * 30, "no such job"), ("server:/tmp/a\0b", "NUL")):
        spec = {"kind": "train", "steps": 1, "model": {"weights": ref}, "data": {"path": ref}}
        _error([c.call(m.JobSubmit(5, json.dumps(spec).encode()))], m.JOB, words)
    # a spec asking for a vocab of 2**40: refused at submit, not failed later
    spec = {
        "kind": "train",
        "steps": 10,
        "model": {"arch": "gpt", "config": {"vocab": 2**40}},
        "data": {"path": "server:/nowhere"},
    }
    _error([c.call(m.JobSubmit(6, json.dumps(spec).encode()))], m.JOB, "vocab", "up to")

    # an ArtifactGet offset >= 2**63 on an artifact the peer owns
    data = b"abc"
    sha = hashlib.sha256(data).digest()
    assert isinstance(c.call(m.ArtifactPut(7, sha, 0, 3, data)), m.Ack)
    _error([c.call(m.ArtifactGet(8, sha, 2**63, 10))], m.JOB, "past")

    # nothing accepted was lost: tensor 1 is still there
    got = c.call(m.Read(9, 1))
    assert isinstance(got, m.Data) and bytes(got.data) == b"\0" * 8
    guard.check()


def test_absurd_shapes_and_dtypes_get_named_errors(secure, peers, raw):
    """Shapes that hold nothing yet cannot be made ([2^40, 2^40, 0] was answered INTERNAL),
    dimensions past 2^40, too many dimensions, an unknown dtype and bytes that do not match:
    each gets MALFORMED (a graph's input BAD_GRAPH) naming what is wrong, and the session
    goes on with what it had."""
    server = secure()
    c = raw(server, peers.attacker)
    c.hello()
    c.send(m.Upload(0, 1, "float32", (2,), b"\0" * 8, 0), m.Sync(1))
    assert c.replies() == [m.Ack(1)]
    cases = [
        (("float32", (2**40, 2**40, 0), b""), "too large"),
        (("float32", (0, 2**40, 2**40, 2**40), b""), "too large"),
        (("uint8", (2**41,), b""), "too large"),
        (("float32", (1,) * (m.MAX_NDIM + 1), b"\0" * 4), "too large"),
        (("float1024", (2,), b"\0" * 8), "float1024"),
        (("float32", (3,), b"\0" * 8), "needs"),
        (("bool", (2**20, 2**20, 2**8), b""), "needs"),
    ]
    for i, ((dtype, shape, data), words) in enumerate(cases, start=2):
        c.send(m.Upload(0, i, dtype, shape, data, 0), m.Sync(i))
        _error(c.replies(), m.MALFORMED, words)
    # a graph declaring such an input is refused when it is registered
    raw_graph = msgpack.packb([GRAPH_FORMAT, [[[2**40, 2**40, 0], "float32"]], [], [0]])
    c.send(m.RegisterGraph(50, hashlib.sha256(raw_graph).digest(), raw_graph), m.Sync(50))
    _error(c.replies(), m.BAD_GRAPH, "elements")
    # an empty tensor of a shape that can be made is fine, and tensor 1 is still there
    c.send(m.Upload(0, 51, "float32", (2**20, 0, 2**20), b"", 0), m.Sync(51))
    assert c.replies() == [m.Ack(51)]
    got = c.call(m.Read(52, 51))
    assert isinstance(got, m.Data) and tuple(got.shape) == (2**20, 0, 2**20)
    got = c.call(m.Read(53, 1))
    assert isinstance(got, m.Data) and bytes(got.data) == b"\0" * 8
