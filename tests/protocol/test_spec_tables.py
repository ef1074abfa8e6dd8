"""The spec's tables are the code's: every message with its tag and fields, every error."""

from __future__ import annotations

import dataclasses
import hashlib

import msgpack
import pytest
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


def test_the_spec_states_the_code_s_protocol_version() -> None:
    text = spec.README.read_text()
    assert f"# burn-remote wire protocol (version {m.PROTOCOL_VERSION})" in text
    assert f"`PROTOCOL_VERSION`, now {m.PROTOCOL_VERSION})" in text


def test_a_group_link_of_another_version_names_it() -> None:
    """§4.1: the version of any GroupLink can be read, whatever its layout."""
    tag, gid = m.GroupLink.TAG, 0x1234
    v3 = m.encode(m.GroupLink(m.PROTOCOL_VERSION, gid, 1, bytes(32), "", b""))
    assert m.is_group_link(v3) and m.read_group_link(v3).group_id == gid
    hello = m.encode(m.Hello(m.PROTOCOL_VERSION, b"", {}))  # another message: refused by name
    with pytest.raises(m.DecodeError, match="expected a GroupLink, got Hello"):
        m.read_group_link(hello)
    for raw, theirs in [
        ([tag, gid, 1, bytes(32)], 2),  # version 2 as first released
        ([tag, gid, 1, bytes(32), ":7001", bytes(32)], 2),  # version 2 with the data plane
        ([tag, 9, gid, 1, bytes(32), "", b"", [1, 2]], 9),  # a later version, more fields
        ([tag, 9, gid, 1, bytes(32), "", b""], 9),  # a later version, the same fields
    ]:
        frame = msgpack.packb([raw], use_bin_type=True)
        assert m.is_group_link(frame)
        try:
            m.read_group_link(frame)
        except m.VersionMismatch as exc:
            assert (exc.theirs, exc.group_id) == (theirs, gid), raw
            assert f"protocol version {theirs}, this server version {m.PROTOCOL_VERSION}" in str(
                exc
            )
        else:
            raise AssertionError(f"{raw} was read as this version's")
    assert not m.is_group_link(m.encode(m.Sync(1)))
