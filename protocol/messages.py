"""The wire protocol between a client and a server (and between two servers), in one module.

A *frame* is the payload of one length-prefixed transport frame. A control frame is a msgpack
array of 1..MAX_BATCH messages; each message is a msgpack array ``[tag, field, field, ...]``
with the fields in the order declared below. Tensor ids are client-chosen u64s, so nothing
waits for an allocation; only messages that get a reply carry a ``request_id`` (also
client-chosen, increasing). Bulk tensor bytes travel on their own streams as two frames: a
one-message control-style frame (``Bulk``) then the raw bytes in chunks of at most
BULK_CHUNK, acknowledged by the receiver (``BulkAck``) so a transfer cut by a lost link
continues where it stopped (see ``protocol/bulk.py``). ``protocol/README.md`` is the prose
version of this file. The message classes are declared by concern (``messages_session``,
``messages_bulk``, ``messages_jobs``, ``messages_groups``) and gathered here, in MESSAGES,
the one table; every name is importable from this module.

Decoding is strict: every size is bounded by the constants below, every field is type-checked,
and any deviation raises :class:`DecodeError` naming what was wrong (never another exception).
"""

from __future__ import annotations

import dataclasses
import operator
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack

from .messages_base import WireMessage
from .messages_bulk import (  # noqa: F401  (their names are this module's too)
    BULK_ACK_EVERY,
    BULK_CHUNK,
    BULK_THRESHOLD,
    BULK_WIRE,
    Bulk,
    BulkAck,
)
from .messages_groups import (  # noqa: F401  (their names are this module's too)
    GROUP_MESSAGE,
    GROUP_MESSAGES,
    GROUP_WIRE,
    LINK_BEAT,
    LINK_TIMEOUT,
    MAX_GROUP,
    RING_CONNECT_TIMEOUT,
    RING_HELLO,
    RING_MAGIC,
    RING_MAX_HEADER,
    RING_PLANES,
    RING_SHARED_ALIGN,
    RING_SHARED_BYTES,
    RING_SHARED_OFFSET,
    RING_TAG,
    GroupAbort,
    GroupBeat,
    GroupClose,
    GroupLink,
    GroupReady,
    GroupSetup,
    GroupStart,
    NcclId,
    RingHeader,
    RingPlane,
)
from .messages_jobs import (  # noqa: F401  (their names are this module's too)
    ARTIFACT_CHUNK,
    JOB_EVENTS_PAGE,
    JOB_MESSAGES,
    JOB_PAGE,
    JOB_WIRE,
    MAX_SPEC,
    ArtifactChunk,
    ArtifactGet,
    ArtifactPut,
    JobCancel,
    JobEvents,
    JobInfo,
    JobList,
    JobStatus,
    JobSubmit,
    JobWatch,
)
from .messages_session import (  # noqa: F401  (their names are this module's too)
    ROOM_PEER,
    ROOM_SERVER,
    ROOM_SESSION,
    SESSION_WIRE,
    Ack,
    Data,
    Drop,
    Error,
    ExecuteGraph,
    Expose,
    Fetch,
    Hello,
    MemoryStats,
    Read,
    RegisterGraph,
    Resync,
    ServerStatus,
    StatusInfo,
    Sync,
    Token,
    Upload,
    Welcome,
)

PROTOCOL_VERSION = 4
"""Sent in Hello and Welcome, and in GroupLink between servers; a server refuses any other
version, naming both. Version 2: bulk transfers in acknowledged chunks (Bulk gained
``offset``, BulkAck is new). Version 3: device groups' TCP data plane (GroupLink gained
``version`` first, ``ring_address`` and ``ring_key``; GroupBeat gained ``data`` and
``waiting``; RingPlane is new). Version 4: keys proven above TLS on each end's first
unidirectional stream (ALPN ``burn-remote/2``; protocol/README.md section 1)."""
GROUP_LINK_V2_FIELDS = (3, 5)
"""Field counts of version 2's GroupLink (it had no ``version`` field; the TCP data plane's
two fields came later under the same version): a server that reads one names its sender's
version 2 instead of a bare decode error."""

MAX_FRAME = 64 * 1024 * 1024
"""Largest frame (bytes) either end accepts; larger frames are refused before decoding."""
MAX_BATCH = 4096
"""Most messages in one control frame."""
MAX_ARRAY = 1_000_000
"""Longest msgpack array anywhere in a message (id lists, shapes, values, batches)."""
MAX_BIN = MAX_FRAME
"""Largest msgpack bin (tensor bytes inline, graph bytes)."""
MAX_STR = 64 * 1024
"""Longest msgpack str (error messages, dtype names, addresses)."""
MAX_MAP = 64
"""Most entries in a msgpack map (only Welcome's limits use one)."""
MAX_NDIM = 32
"""Most dimensions of a tensor shape."""
MAX_DIM = 2**40
"""Largest dimension of a tensor shape."""
MAX_SHAPE_EXTENT = 2**48
"""Largest product of a shape's dimensions with each 0 counted as 1 (its *extent*). NumPy
refuses a shape whose extent passes its address space even when a dimension is 0
([2**40, 2**40, 0] holds nothing, yet cannot be made), so such a shape is refused when the
message is decoded, by name, instead of failing later inside the engine."""
U64_MAX = 2**64 - 1

# --- error codes ---------------------------------------------------------------------------
MALFORMED = 1
"""The frame or a message in it did not decode; the frame was skipped."""
VERSION = 2
"""Hello (or a server's GroupLink) carried another PROTOCOL_VERSION; the connection is
closed after this error."""
UNKNOWN_GRAPH = 3
"""ExecuteGraph named a digest the server does not hold (never registered, or evicted). The
session stalls: every later message is skipped (requests answered with STALLED) until Resync."""
BAD_GRAPH = 4
"""RegisterGraph did not validate, or its recomputed digest differs from the claimed one."""
EXECUTION = 5
"""A kernel failed; ``node`` is the index of the failing node in the graph."""
MISSING_TENSOR = 6
"""A message referred to a tensor id this session does not hold."""
LIMIT = 7
"""A resource limit (frame, tensor, graph or session count, memory quota) was exceeded."""
STALLED = 8
"""A request arrived while the session was stalled after UNKNOWN_GRAPH; resend it after Resync."""
CAPABILITY = 9
"""A Fetch token was unknown, already used, bound to another peer, or the fetch failed."""
INTERNAL = 10
"""The server hit a bug; the session goes on."""
JOB = 11
"""A job or artifact request was refused: invalid spec (the message names the key path),
unknown job or artifact, checksum mismatch, jobs not enabled, disk full. Nothing already
accepted is lost."""
SESSION_EXPIRED = 12
"""A resume token names no parked session (its grace period is over, or it never existed)."""
FORBIDDEN = 13
"""The request needs the ``admin`` role (authorised-peers file) or the server's own key."""
GROUP = 14
"""A device group could not be set up, or a collective could not complete: a rank died, was
cut off, was late or disagreed. The message has the form ``group <16 hex digits>: rank <r>
(<peer id>): <reason>`` (``GROUP_MESSAGE``) naming the culprit; every later collective on
that group fails the same way."""


class DecodeError(ValueError):
    """A frame or message did not follow this protocol; the text names what was wrong."""


# --- the one table of messages ---------------------------------------------------------------
Message = WireMessage
"""Any message of this protocol: an instance of one of the classes in MESSAGES."""

MESSAGES: dict[int, type[WireMessage]] = {
    c.TAG: c for c in (*SESSION_WIRE, *BULK_WIRE, *JOB_WIRE, *GROUP_WIRE)
}
"""Tag -> message class: every message, declared once in the module of its concern
(messages_session, messages_bulk, messages_jobs, messages_groups); the decoder's schemas,
the encoder's field getters and protocol/README.md's table are all read from here."""
if len(MESSAGES) != len(SESSION_WIRE) + len(BULK_WIRE) + len(JOB_WIRE) + len(GROUP_WIRE):
    raise ImportError("two messages share a tag")  # a declaration mistake, caught at import

CLIENT_REQUESTS: tuple[type, ...] = (
    Upload,
    RegisterGraph,
    ExecuteGraph,
    Read,
    Drop,
    Sync,
    MemoryStats,
    Resync,
    Expose,
    Fetch,
    JobSubmit,
    JobList,
    JobStatus,
    JobCancel,
    JobWatch,
    ArtifactPut,
    ArtifactGet,
    ServerStatus,
    GroupSetup,
    GroupStart,
    GroupClose,
)
"""What a client may send on its control stream after Hello: the server's handler table has
exactly one entry for each (``server/_handlers.py``; a test checks)."""


# --- field checks (by annotation) ----------------------------------------------------------
def _u64(v: Any, name: str) -> int:
    if type(v) is not int or not 0 <= v <= U64_MAX:
        raise DecodeError(f"{name}: expected an unsigned 64-bit integer, got {_show(v)}")
    return v


def _i64(v: Any, name: str) -> int:
    if type(v) is not int or not -(2**63) <= v <= U64_MAX:
        raise DecodeError(f"{name}: expected an integer, got {_show(v)}")
    return v


def _str(v: Any, name: str) -> str:
    if type(v) is not str:
        raise DecodeError(f"{name}: expected a string, got {_show(v)}")
    return v


def _bin(v: Any, name: str) -> bytes:
    if type(v) is not bytes:
        raise DecodeError(f"{name}: expected bytes, got {_show(v)}")
    return v


_INTS = {int}
_SCALARS = frozenset({int, float, bool})


def _ids(v: Any, name: str) -> tuple[int, ...]:
    if type(v) is not list:
        raise DecodeError(f"{name}: expected an array of ids, got {_show(v)}")
    if not v:
        return ()
    if set(map(type, v)) == _INTS:  # the common case, checked in C: no Python per element
        try:
            array("Q", v)  # each in [0, 2**64): one pass (min and max took two)
        except OverflowError:
            pass
        else:
            return tuple(v)
    return tuple(_u64(x, f"{name}[{i}]") for i, x in enumerate(v))


def shape_extent(shape: tuple[int, ...] | list[int]) -> int:
    """The product of ``shape``'s dimensions with each 0 counted as 1 (``MAX_SHAPE_EXTENT``)."""
    extent = 1
    for d in shape:
        extent *= d or 1
    return extent


def _shape(v: Any, name: str) -> tuple[int, ...]:
    ids = _ids(v, name)
    if len(ids) > MAX_NDIM or (
        ids and (max(ids) > MAX_DIM or shape_extent(ids) > MAX_SHAPE_EXTENT)
    ):
        raise DecodeError(
            f"{name}: shape {list(ids)[:8]} is too large (at most {MAX_NDIM} dimensions, "
            f"each <= 2^40, multiplying to <= 2^48 with a 0 counted as 1)"
        )
    return ids


def _values(v: Any, name: str) -> tuple[float | int | bool, ...]:
    if type(v) is not list:
        raise DecodeError(f"{name}: expected an array of scalars, got {_show(v)}")
    if not set(map(type, v)) <= _SCALARS:  # checked in C; the message names the first
        for i, x in enumerate(v):
            if type(x) not in _SCALARS:
                raise DecodeError(f"{name}[{i}]: expected a number or bool, got {_show(x)}")
    return tuple(v)


def _limits(v: Any, name: str) -> dict[str, int]:
    if type(v) is not dict:
        raise DecodeError(f"{name}: expected a map, got {_show(v)}")
    return {_str(k, f"{name} key"): _i64(x, f"{name}[{k!r}]") for k, x in v.items()}


MAX_EXTENSIONS = 256
"""Entries a Hello or Welcome extension map may hold."""


def _names(v: Any, name: str) -> dict[str, str]:
    if type(v) is not dict or len(v) > MAX_EXTENSIONS:
        raise DecodeError(
            f"{name}: expected a map of at most {MAX_EXTENSIONS} names, got {_show(v)}"
        )
    return {_str(k, f"{name} key"): _str(x, f"{name}[{k!r}]") for k, x in v.items()}


def _peers(v: Any, name: str) -> tuple[str, ...]:
    if type(v) is not list or not 1 <= len(v) <= MAX_GROUP:
        raise DecodeError(f"{name}: expected an array of 1..{MAX_GROUP} peer ids, got {_show(v)}")
    return tuple(_str(x, f"{name}[{i}]") for i, x in enumerate(v))


_CHECKS = {
    "int": _u64,
    "tuple[str, ...]": _peers,
    "str": _str,
    "bytes": _bin,
    "tuple[int, ...]": _ids,
    "tuple[float | int | bool, ...]": _values,
    "dict[str, int]": _limits,
    "dict[str, str]": _names,
}
_BY_NAME = {"shape": _shape, "node": _i64}
"""Fields whose check is stricter (shape) or signed (node: -1 means none)."""
_SCHEMAS: dict[type, tuple[tuple[str, Any, str], ...]] = {
    cls: tuple(
        (f.name, _BY_NAME.get(f.name) or _CHECKS[str(f.type)], f"({cls.__name__}).{f.name}")
        for f in dataclasses.fields(cls)
    )
    for cls in MESSAGES.values()
}
"""Per message class, in wire order: (field, check, the field's name in errors, made once)."""


def _show(v: Any) -> str:
    text = repr(v)
    return f"{type(v).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


# --- encoding ------------------------------------------------------------------------------
def _field_getter(cls: type) -> Callable[[Any], tuple[Any, ...]]:
    """The message's fields in wire order, read in C (msgpack packs tuples as arrays)."""
    names = [name for name, _, _ in _SCHEMAS[cls]]
    if not names:
        return lambda msg: ()
    if len(names) == 1:
        get = operator.attrgetter(names[0])
        return lambda msg: (get(msg),)
    return operator.attrgetter(*names)


_FIELDS: dict[type, Callable[[Any], tuple[Any, ...]]] = {
    cls: _field_getter(cls) for cls in MESSAGES.values()
}


def _pack_one(msg: Any) -> tuple[Any, ...]:
    return (msg.TAG, *_FIELDS[type(msg)](msg))


def encode(messages: Message | list[Message] | tuple[Message, ...]) -> bytes:
    """One control frame holding one message or a batch of them."""
    if not isinstance(messages, list | tuple):
        messages = [messages]
    return msgpack.packb([_pack_one(m) for m in messages], use_bin_type=True)


def packer() -> msgpack.Packer:
    """A Packer that encodes a message's ``(TAG, *fields)`` tuple (or list) exactly as
    ``encode`` does, for a sender that encodes messages one at a time as it queues them and
    keeps one Packer (its buffer is reused: no allocation per message). Not thread-safe."""
    return msgpack.Packer(use_bin_type=True)


def encode_one(msg: Message, packer: msgpack.Packer) -> bytes:
    """One message as ``encode`` writes it inside a frame (see ``frame_of``)."""
    return packer.pack(_pack_one(msg))


def encode_inline_upload(
    packer: msgpack.Packer, tensor_id: int, dtype: str, shape: Any, data: Any, request_id: int = 0
) -> bytes:
    """``encode_one(Upload(request_id, tensor_id, dtype, shape, data, 0))`` without building
    the message:
    ``data`` may be any buffer (an array's memory), packed as bin without a copy first. The
    field order is Upload's, kept here beside its class (the step's hot path)."""
    return packer.pack((Upload.TAG, request_id, tensor_id, dtype, shape, data, 0))


def encode_execute_graph(
    packer: msgpack.Packer,
    request_id: int,
    digest: bytes,
    input_ids: Any,
    values: Any,
    output_ids: Any,
    drops: Any,
) -> bytes:
    """``encode_one(ExecuteGraph(...))`` from the lists a replay already holds (no tuples
    or message object per step); ExecuteGraph's field order, kept beside its class."""
    return packer.pack((ExecuteGraph.TAG, request_id, digest, input_ids, values, output_ids, drops))


def encode_data_frame(
    packer: msgpack.Packer, request_id: int, dtype: str, shape: Any, data: Any
) -> bytes:
    """``encode(Data(request_id, dtype, shape, data, 0))`` without building the message, with
    a kept ``packer``: the reply frame to a lone Read of a small tensor (the server answers
    ``item()`` with it on its receive loop); ``data`` may be any buffer (an array's memory).
    Data's field order, kept beside its class."""
    return packer.pack(((Data.TAG, request_id, dtype, shape, data, 0),))


def frame_of(encoded: list[bytes], reserve: int = 0) -> bytes | bytearray:
    """A control frame from messages encoded one by one (``packer``): the bytes ``encode``
    gives for the same messages (a msgpack array header, then its elements in order).

    ``reserve`` > 0 gives a bytearray with that many zero bytes before the frame, for a
    sender to write its own headers into (a length prefix, a sequencing header): the
    frame's bytes are then copied once on their way to the transport, not once per header."""
    n = len(encoded)
    if n < 16:
        head = bytes((0x90 | n,))
    elif n < 0x10000:
        head = b"\xdc" + n.to_bytes(2, "big")
    else:
        head = b"\xdd" + n.to_bytes(4, "big")
    if reserve:
        head = bytes(reserve) + head
    encoded.insert(0, head)
    try:
        return bytearray().join(encoded) if reserve else b"".join(encoded)
    finally:
        del encoded[0]


def decode_message(raw: Any, where: str = "message") -> Message:
    """Check one already-unpacked message array and build its dataclass."""
    if type(raw) is not list or not raw:
        raise DecodeError(f"{where}: expected a non-empty array [tag, fields...], got {_show(raw)}")
    tag = raw[0]
    cls = MESSAGES.get(tag) if type(tag) is int else None
    if cls is None:
        raise DecodeError(f"{where}: unknown message tag {_show(tag)}")
    n, build = _BUILDERS[tag]
    if len(raw) != n + 1:
        raise DecodeError(f"{where} ({cls.__name__}): expected {n} fields, got {len(raw) - 1}")
    try:
        return build(raw)
    except DecodeError as exc:
        raise DecodeError(f"{where} {exc}") from None


_INLINE_CHECKS: dict[Any, str] = {
    _u64: "type({v}) is int and 0 <= {v} <= U64_MAX",
    _i64: "type({v}) is int and -(2**63) <= {v} <= U64_MAX",
    _str: "type({v}) is str",
    _bin: "type({v}) is bytes",
}
"""Checks whose passing case the generated builders test inline (the check function then
runs only to raise its error): a message's scalar fields cost no call each."""


def _builder(cls: type) -> tuple[int, Callable[[list[Any]], Any]]:
    """(field count, a function that checks a raw message array's fields and builds
    ``cls``): generated once per class from its schema, as dataclasses generate __init__,
    so a message costs its field checks and nothing per field beside them. The object is
    made with its slots set directly (frozen dataclasses set each field through
    ``object.__setattr__``, about twice as slow; no message class has a __post_init__)."""
    schema = _SCHEMAS[cls]
    env: dict[str, Any] = {"cls": cls, "new": object.__new__, "U64_MAX": U64_MAX}
    lines = ["def build(raw):"]
    names = [f"v{k}" for k in range(len(schema))]
    if names:
        lines.append(f"    _, {', '.join(names)}, = raw")
    lines.append("    o = new(cls)")
    for k, (name, check, label) in enumerate(schema):
        v = names[k]
        env[f"c{k}"], env[f"l{k}"], env[f"s{k}"] = check, label, getattr(cls, name).__set__
        inline = _INLINE_CHECKS.get(check)
        if inline is not None:
            lines.append(f"    if not ({inline.format(v=v)}):")
            lines.append(f"        {v} = c{k}({v}, l{k})")
        else:
            lines.append(f"    {v} = c{k}({v}, l{k})")
        lines.append(f"    s{k}(o, {v})")
    lines.append("    return o")
    exec("\n".join(lines) + "\n", env)  # noqa: S102
    return len(schema), env["build"]


class _Builders(dict[int, tuple[int, Callable[[list[Any]], Any]]]):
    """Tag -> ``_builder(cls)``, each generated when its first message is decoded: a
    client decodes a handful of the 45 message classes, and generating them all took about
    5 ms of every process's first connection (issue 35's first contact)."""

    def __missing__(self, tag: int) -> tuple[int, Callable[[list[Any]], Any]]:
        entry = self[tag] = _builder(MESSAGES[tag])  # (two threads may both make it: same)
        return entry


_BUILDERS = _Builders()


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A message of a frame that did not decode (``decode_each``): answered by
    Error(MALFORMED) in its place while the frame's other messages are processed."""

    reason: str
    """What was wrong (the DecodeError's text)."""
    request_id: int
    """The message's request id when it could be read, else 0."""


def decode_each(frame: bytes | bytearray | memoryview) -> list[Message | Undecodable]:
    """Decode a control frame message by message: one bad message does not cost the others.

    Raises:
        DecodeError: the frame itself is not a msgpack array of 1..MAX_BATCH messages.
    """
    out: list[Message | Undecodable] = []
    builders = _BUILDERS
    for i, raw in enumerate(_unpack_frame(frame)):
        if type(raw) is list and raw and type(raw[0]) is int:  # the common case, at once
            entry = builders.get(raw[0]) or (builders[raw[0]] if raw[0] in MESSAGES else None)
            if entry is not None and len(raw) == entry[0] + 1:
                try:
                    out.append(entry[1](raw))
                    continue
                except DecodeError:
                    pass  # decode_message names the message and the field
        try:
            out.append(decode_message(raw, f"message {i}"))
        except DecodeError as exc:
            out.append(Undecodable(str(exc), _readable_request_id(raw)))
    return out


def _readable_request_id(raw: Any) -> int:
    """The request id of a message that failed to decode, if its tag and first field say."""
    if type(raw) is not list or len(raw) < 2 or type(raw[0]) is not int:
        return 0
    cls = MESSAGES.get(raw[0])
    fields = dataclasses.fields(cls) if cls is not None else ()
    rid = raw[1]
    ok = fields and fields[0].name == "request_id" and type(rid) is int and 0 <= rid <= U64_MAX
    return rid if ok else 0


def decode(frame: bytes | bytearray | memoryview) -> list[Message]:
    """Decode a control frame into its messages; raises DecodeError, never anything else."""
    return [decode_message(one, f"message {i}") for i, one in enumerate(_unpack_frame(frame))]


def _unpack_frame(frame: bytes | bytearray | memoryview) -> list[Any]:
    """The raw message arrays of a control frame, within the decoder limits."""
    if len(frame) > MAX_FRAME:
        raise DecodeError(f"frame of {len(frame)} bytes exceeds MAX_FRAME {MAX_FRAME}")
    try:
        raw = msgpack.unpackb(
            frame,
            raw=False,
            use_list=True,
            strict_map_key=True,
            max_str_len=MAX_STR,
            max_bin_len=MAX_BIN,
            max_array_len=MAX_ARRAY,
            max_map_len=MAX_MAP,
            max_ext_len=0,
        )
    except (ValueError, TypeError, msgpack.UnpackException, RecursionError) as exc:
        raise DecodeError(f"frame is not valid msgpack within limits: {exc}") from None
    except Exception as exc:  # msgpack raises a few odd types on hostile input
        raise DecodeError(f"frame is not valid msgpack: {type(exc).__name__}: {exc}") from None
    if type(raw) is not list or not 1 <= len(raw) <= MAX_BATCH:
        raise DecodeError(f"frame: expected an array of 1..{MAX_BATCH} messages, got {_show(raw)}")
    return raw


class VersionMismatch(DecodeError):
    """A server's GroupLink of another protocol version (``theirs``), for ``group_id`` (0
    where it cannot be read)."""

    def __init__(self, theirs: int, group_id: int = 0) -> None:
        super().__init__(
            f"it speaks protocol version {theirs}, this server version {PROTOCOL_VERSION} "
            "(every server of a group must run the same protocol version)"
        )
        self.theirs, self.group_id = theirs, group_id


def is_group_link(frame: bytes | bytearray | memoryview) -> bool:
    """Whether a connection's first frame is one GroupLink, of any protocol version (so a
    link from a server of another version is answered with VERSION, not taken for a
    session)."""
    try:
        raw = _unpack_frame(frame)
    except DecodeError:
        return False
    return len(raw) == 1 and type(raw[0]) is list and bool(raw[0]) and raw[0][0] == GroupLink.TAG


def read_group_link(frame: bytes | bytearray | memoryview) -> GroupLink:
    """The GroupLink of another server's frame. Raises VersionMismatch naming both versions
    when it is of another protocol version (its first field from version 3 on; version 2's
    had none: ``GROUP_LINK_V2_FIELDS``), DecodeError when it is malformed."""
    raw = _unpack_frame(frame)
    one = raw[0] if len(raw) == 1 else None
    if type(one) is not list or not one or one[0] != GroupLink.TAG:
        other = decode_message(one, "GroupLink")  # a malformed one raises, naming the fault
        raise DecodeError(f"expected a GroupLink, got {type(other).__name__}")
    if len(one) - 1 in GROUP_LINK_V2_FIELDS:
        raise VersionMismatch(2, _int_at(one, 1))
    theirs = one[1] if len(one) > 1 else None
    if type(theirs) is int and theirs != PROTOCOL_VERSION:
        raise VersionMismatch(theirs, _int_at(one, 2))
    return decode_message(one, "GroupLink")  # type: ignore[return-value]


def _int_at(raw: list[Any], k: int) -> int:
    value = raw[k] if k < len(raw) else 0
    return value if type(value) is int and 0 <= value <= U64_MAX else 0


def digest_bytes(hex_digest: str) -> bytes:
    """The 32-byte wire form of a graph digest."""
    return bytes.fromhex(hex_digest)


__all__ = [
    "BULK_ACK_EVERY",
    "BULK_CHUNK",
    "BULK_THRESHOLD",
    "MAX_ARRAY",
    "MAX_BATCH",
    "MAX_BIN",
    "MAX_FRAME",
    "MAX_MAP",
    "MAX_DIM",
    "MAX_NDIM",
    "MAX_SHAPE_EXTENT",
    "MAX_STR",
    "PROTOCOL_VERSION",
    "VersionMismatch",
    "DecodeError",
    "Message",
    "decode",
    "is_group_link",
    "read_group_link",
    "decode_message",
    "encode",
    "encode_data_frame",
    "encode_execute_graph",
    "encode_inline_upload",
    "encode_one",
    "frame_of",
    "packer",
    "shape_extent",
]
