"""The spec's tables are the code's: every message with its tag and fields, every error."""

from __future__ import annotations

import dataclasses
import hashlib

from burn_remote.protocol import messages as m
from burn_remote.protocol.graph import decode, validate

from . import spec

_WIRE_TYPES = {
    "int": "u64",
    "str": "str",
    "bytes": "bin",
    "tuple[int, ...]": "ids",
    "tuple[float | int | bool, ...]": "values",
    "tuple[str, ...]": "peers",
    "dict[str, int]": "map",
    "dict[str, str]": "map",
}
_BY_NAME = {"shape": "shape", "node": "i64"}


def test_every_message_is_in_the_spec_with_its_tag_and_fields() -> None:
    table = spec.messages()
    assert {s.tag: name for name, s in table.items()} == {
        tag: cls.__name__ for tag, cls in m.MESSAGES.items()
    }
    for cls in m.MESSAGES.values():
        want = tuple(
            (f.name, _BY_NAME.get(f.name) or _WIRE_TYPES[f.type]) for f in dataclasses.fields(cls)
        )
        assert table[cls.__name__].fields == want, cls.__name__


def test_every_error_code_is_in_the_spec() -> None:
    codes = {name: getattr(m, name) for name in spec.errors()}
    assert codes == spec.errors()
    assert sorted(codes.values()) == list(range(1, len(codes) + 1))  # none left out
    assert len(codes) == m.GROUP  # the last code messages.py declares


def test_the_worked_graph_example_is_canonical_and_its_digest_right() -> None:
    data, digest = spec.worked_example()
    graph = decode(data)
    validate(graph)
    assert graph.encode() == data
    assert hashlib.sha256(data).hexdigest() == digest == graph.digest()
