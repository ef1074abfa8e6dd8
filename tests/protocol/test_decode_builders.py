"""The generated message builders (protocol/messages.py, ``_builder``) check every field as
its schema's check function does and build the same message: each message class decodes
from a frame to an equal object, and a wrong value in any field gives the error the field's
check gives, naming the message and the field, without costing the frame's other messages."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from burn_remote.protocol import messages as m

GOOD: dict[Any, Any] = {
    m._u64: 2**64 - 1,
    m._i64: -(2**63),
    m._str: "name",
    m._bin: b"\x00\x01",
    m._ids: [0, 7, 2**64 - 1],
    m._shape: [2, 3],
    m._values: [1.5, 2, True],
    m._limits: {"max_frame": 4096},
    m._names: {"op": "1.0"},
    m._peers: ["peer"],
}
BAD: dict[Any, list[Any]] = {
    m._u64: [True, -1, -(2**63), 1.0, "1", None, [1]],
    m._i64: [False, 0.5, b"1", None],
    m._str: [1, b"x", None, ["x"]],
    m._bin: ["x", 1, None, [b"x"]],
    m._ids: [[True], [-1], [1, -(2**63)], [1.0], "x", None],
    m._shape: [[2**41], list(range(m.MAX_NDIM + 1)), [False]],
    m._values: [["x"], [None], 1.0],
    m._limits: [{"a": "b"}, ["a"]],
    m._names: [{"a": 1}, "a"],
    m._peers: [[], [1], "p"],
}


def _fields(cls: type) -> list[Any]:
    return [GOOD[check] for _, check, _ in m._SCHEMAS[cls]]


@pytest.mark.parametrize("cls", sorted(m.MESSAGES.values(), key=lambda c: c.TAG), ids=repr)
def test_every_message_decodes_to_what_its_checks_build(cls: type) -> None:
    fields = _fields(cls)
    frame = msgpack.packb([[cls.TAG, *fields]], use_bin_type=True)
    (msg,) = m.decode_each(frame)
    expected = cls(*[check(v, label) for v, (_, check, label) in zip(fields, m._SCHEMAS[cls])])
    assert type(msg) is cls and msg == expected
    assert m.decode(frame) == [expected] and m.encode(msg) == m.encode(expected)


@pytest.mark.parametrize("cls", sorted(m.MESSAGES.values(), key=lambda c: c.TAG), ids=repr)
def test_a_wrong_field_is_named_as_its_check_names_it(cls: type) -> None:
    good = _fields(cls)
    for k, (_, check, label) in enumerate(m._SCHEMAS[cls]):
        for bad in BAD[check]:
            fields = list(good)
            fields[k] = bad
            frame = msgpack.packb([[cls.TAG, *fields], [m.Sync.TAG, 5]], use_bin_type=True)
            with pytest.raises(m.DecodeError) as want:
                check(bad, label)
            first, second = m.decode_each(frame)
            assert type(first) is m.Undecodable
            assert first.reason == f"message 0 {want.value}"
            assert second == m.Sync(5)
            with pytest.raises(m.DecodeError, match="message 0"):
                m.decode(frame)


def test_a_message_of_the_wrong_length_or_tag_is_refused_by_name() -> None:
    frame = msgpack.packb(
        [[m.Sync.TAG], [m.Sync.TAG, 1, 2], [True, 1], [999, 1], [m.Sync.TAG, 3]],
        use_bin_type=True,
    )
    *bad, ok = m.decode_each(frame)
    assert ok == m.Sync(3)
    assert [b.reason for b in bad] == [
        "message 0 (Sync): expected 1 fields, got 0",
        "message 1 (Sync): expected 1 fields, got 2",
        "message 2: unknown message tag bool True",
        "message 3: unknown message tag int 999",
    ]
