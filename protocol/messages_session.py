"""The session's messages: the handshake, tensors and graphs, reads, errors, server-to-server
moves and the server's status (tags 1..16, 50..51). Fields are wire order; see
``protocol/messages.py`` for framing and decoding, ``protocol/README.md`` for the prose.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from .messages_base import WireMessage


@dataclass(frozen=True, slots=True)
class Hello(WireMessage):
    """Client -> server, first message of the control stream."""

    TAG: ClassVar[int] = 1
    version: int
    """The client's PROTOCOL_VERSION."""
    resume_token: bytes
    """Empty for a new session (resuming a detached session is reserved for later versions)."""
    extensions: dict[str, str] = dataclasses.field(default_factory=dict)
    """Op extensions the client has loaded, name -> version (at most MAX_EXTENSIONS)."""


@dataclass(frozen=True, slots=True)
class Welcome(WireMessage):
    """Server -> client, answer to Hello."""

    TAG: ClassVar[int] = 2
    version: int
    """The server's PROTOCOL_VERSION."""
    session_id: int
    """Server-chosen id of this session (for logs and MemoryStats)."""
    resume_token: bytes
    """Opaque token naming this session (reserved for resumption)."""
    server_peer_id: str
    """The server's peer id (already proven by TLS; repeated for logs)."""
    limits: dict[str, int]
    """The server's limits: max_frame, max_tensors, max_graphs, session_memory, bulk_threshold."""
    extensions: dict[str, str] = dataclasses.field(default_factory=dict)
    """Op extensions installed on the server (entry points), name -> version: a graph using
    any other is refused with BAD_GRAPH naming it."""


@dataclass(frozen=True, slots=True)
class Upload(WireMessage):
    """Store a tensor under a client-chosen id (replacing any tensor with that id). No reply
    (an Error naming ``request_id`` when it fails)."""

    TAG: ClassVar[int] = 3
    request_id: int
    """Names this Upload in an Error about it (0: the client does not need it named)."""
    tensor_id: int
    """Client-chosen u64 id of the new tensor."""
    dtype: str
    """Wire dtype name (protocol/dtypes.py)."""
    shape: tuple[int, ...]
    """Dimensions; the data holds prod(shape) elements."""
    data: bytes
    """C-order little-endian element bytes; empty when ``bulk_id`` is set."""
    bulk_id: int
    """0 for inline data; else the id of the Bulk transfer that carries the bytes."""


@dataclass(frozen=True, slots=True)
class RegisterGraph(WireMessage):
    """Make a graph known under its digest; the server recomputes the digest. No reply
    (Error naming ``request_id`` when it is refused)."""

    TAG: ClassVar[int] = 4
    request_id: int
    """Client-chosen id that an Error about this registration names."""
    digest: bytes
    """sha256 (32 bytes) of the canonical graph encoding."""
    graph: bytes
    """The graph encoding (protocol/graph.py ``Graph.encode``); the server re-encodes it
    canonically and registers it under the canonical digest."""


@dataclass(frozen=True, slots=True)
class ExecuteGraph(WireMessage):
    """Run a registered graph under bindings. Replies only on failure (Error)."""

    TAG: ClassVar[int] = 5
    request_id: int
    """Client-chosen id that an Error about this execution names."""
    digest: bytes
    """Digest of a graph registered earlier in this or any session."""
    input_ids: tuple[int, ...]
    """Tensor ids bound to the graph's inputs, in order."""
    values: tuple[float | int | bool, ...]
    """Scalars bound to the graph's value nodes, in order."""
    output_ids: tuple[int, ...]
    """Ids under which the graph's outputs are stored, in order."""
    drops: tuple[int, ...]
    """Tensor ids to forget after the graph ran (batched drops)."""


@dataclass(frozen=True, slots=True)
class Read(WireMessage):
    """Ask for a tensor's value; answered by Data (or Error)."""

    TAG: ClassVar[int] = 6
    request_id: int
    """Client-chosen id the Data reply repeats."""
    tensor_id: int
    """The tensor to read."""


@dataclass(frozen=True, slots=True)
class Data(WireMessage):
    """A tensor's value, answer to Read (or to Fetch between servers)."""

    TAG: ClassVar[int] = 7
    request_id: int
    """The Read's request id (0 on a Fetch stream)."""
    dtype: str
    """Wire dtype name."""
    shape: tuple[int, ...]
    """Dimensions."""
    data: bytes
    """Element bytes; empty when ``bulk_id`` is set."""
    bulk_id: int
    """0 for inline data; else the bytes follow on a bulk stream with this id."""


@dataclass(frozen=True, slots=True)
class Drop(WireMessage):
    """Forget tensors. No reply."""

    TAG: ClassVar[int] = 8
    tensor_ids: tuple[int, ...]
    """Ids to forget; unknown ids are ignored."""


@dataclass(frozen=True, slots=True)
class Sync(WireMessage):
    """Barrier: answered by Ack once every earlier message was processed."""

    TAG: ClassVar[int] = 9
    request_id: int
    """Client-chosen id the Ack repeats."""


@dataclass(frozen=True, slots=True)
class Ack(WireMessage):
    """Answer to Sync."""

    TAG: ClassVar[int] = 10
    request_id: int
    """The Sync's request id."""


@dataclass(frozen=True, slots=True)
class Error(WireMessage):
    """Something failed; the session goes on (except after VERSION)."""

    TAG: ClassVar[int] = 11
    code: int
    """One of the error codes above."""
    message: str
    """Human-readable cause."""
    node: int
    """Index of the failing graph node, or -1 (a signed integer)."""
    request_id: int
    """The request this error answers or is about (ExecuteGraph, Read, ...), or 0."""


@dataclass(frozen=True, slots=True)
class MemoryStats(WireMessage):
    """Request (client -> server, counts 0) and reply (server -> client) in one message."""

    TAG: ClassVar[int] = 12
    request_id: int
    """Client-chosen id; the reply repeats it."""
    session_tensors: int
    """Tensors this session holds."""
    session_bytes: int
    """Bytes this session's tensors occupy."""
    server_tensors: int
    """Tensors all sessions hold."""
    server_bytes: int
    """Bytes all sessions' tensors occupy."""
    sessions: int
    """Live sessions on the server."""
    session_peak: int = 0
    """Highest `session_bytes` this session has reached."""
    server_peak: int = 0
    """Highest `server_bytes` since the server started."""
    room: int = 0
    """Bytes this session may still add before a limit refuses them: the least of what its
    session quota, its peer's share and the server's memory limit leave (0 in a request)."""
    room_limit: int = 0
    """Which limit leaves `room`: ROOM_SESSION, ROOM_PEER or ROOM_SERVER (0 in a request)."""


ROOM_SESSION, ROOM_PEER, ROOM_SERVER = 1, 2, 3
"""`MemoryStats.room_limit`: the session's quota (``--session-memory``), its peer's share of
the server (``--peer-memory``) or the server's memory limit (``--memory-limit``)."""


@dataclass(frozen=True, slots=True)
class Resync(WireMessage):
    """Client -> server after UNKNOWN_GRAPH: leave the stalled state; the client then resends
    RegisterGraph and every message from the failed ExecuteGraph on. No reply."""

    TAG: ClassVar[int] = 13


@dataclass(frozen=True, slots=True)
class Expose(WireMessage):
    """Client -> source server: grant a one-time capability to fetch a tensor. Answered by
    Token."""

    TAG: ClassVar[int] = 14
    request_id: int
    """Client-chosen id the Token repeats."""
    tensor_id: int
    """The tensor to expose (its value at this point of the session)."""
    peer_id: str
    """The only peer (the destination server) that may use the token."""


@dataclass(frozen=True, slots=True)
class Token(WireMessage):
    """Source server -> client: the capability granted by Expose."""

    TAG: ClassVar[int] = 15
    request_id: int
    """The Expose's request id."""
    token: bytes
    """32 random bytes; valid once, only for the peer named in Expose."""


@dataclass(frozen=True, slots=True)
class Fetch(WireMessage):
    """Two uses. Client -> destination server (control stream): store under ``tensor_id`` the
    tensor that ``source_peer`` exposed under ``token``. Destination -> source server (first
    and only request on a fresh connection's stream): send the tensor; answered by Data."""

    TAG: ClassVar[int] = 16
    tensor_id: int
    """Id under which the destination stores the tensor (0 on the server-to-server leg)."""
    source_peer: str
    """Peer id of the source server."""
    source_address: str
    """Always "": a server resolves the source's address itself and answers FORBIDDEN to a
    Fetch that names one (version 2 clients sent theirs here)."""
    token: bytes
    """The capability from Token."""


@dataclass(frozen=True, slots=True)
class ServerStatus(WireMessage):
    """Ask for the server's status (sessions, memory, plan cache, jobs, errors); answered by
    StatusInfo, or Error(FORBIDDEN) unless the peer is an admin or the server itself."""

    TAG: ClassVar[int] = 50
    request_id: int
    """Client-chosen id the reply repeats."""


@dataclass(frozen=True, slots=True)
class StatusInfo(WireMessage):
    """Server -> client: answer to ServerStatus."""

    TAG: ClassVar[int] = 51
    request_id: int
    """The request's id."""
    info: bytes
    """UTF-8 JSON object: ``peer_id``, ``device``, ``uptime_s``, ``sessions`` (one row each),
    ``memory``, ``plan_cache``, ``jobs``, ``errors`` (see ``server/_status.py``)."""


SESSION_WIRE: tuple[type[WireMessage], ...] = (
    Hello,
    Welcome,
    Upload,
    RegisterGraph,
    ExecuteGraph,
    Read,
    Data,
    Drop,
    Sync,
    Ack,
    Error,
    MemoryStats,
    Resync,
    Expose,
    Token,
    Fetch,
    ServerStatus,
    StatusInfo,
)
"""Every message declared here, in tag order (``messages.MESSAGES`` joins the tables)."""
