"""The wire protocol between a client and a server (and between two servers), in one module.

A *frame* is the payload of one length-prefixed transport frame. A control frame is a msgpack
array of 1..MAX_BATCH messages; each message is a msgpack array ``[tag, field, field, ...]``
with the fields in the order declared below. Tensor ids are client-chosen u64s, so nothing
waits for an allocation; only messages that get a reply carry a ``request_id`` (also
client-chosen, increasing). Bulk tensor bytes travel on their own streams as two frames: a
one-message control-style frame (``Bulk``) then the raw bytes in chunks of at most
BULK_CHUNK, acknowledged by the receiver (``BulkAck``) so a transfer cut by a lost link
continues where it stopped (see ``protocol/bulk.py``). ``protocol/README.md`` is the prose
version of this file.

Decoding is strict: every size is bounded by the constants below, every field is type-checked,
and any deviation raises :class:`DecodeError` naming what was wrong (never another exception).
"""

from __future__ import annotations

import dataclasses
import operator
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import msgpack

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
BULK_THRESHOLD = 256 * 1024
"""Tensor bytes above this travel on a bulk stream instead of inline (both directions); a
server whose frame limit is smaller announces a smaller threshold in Welcome.limits."""
BULK_CHUNK = 1024 * 1024
"""Largest raw-bytes frame on a bulk stream: a tensor moves as a sequence of these, each
written into its destination buffer as it arrives."""
BULK_ACK_EVERY = 2 * 1024 * 1024
"""The receiver of a bulk transfer sends BulkAck at least this often (in bytes) and at the
end; after a lost link the sender continues from the last acknowledged offset."""

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


# --- messages ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Hello:
    """Client -> server, first message of the control stream."""

    TAG: ClassVar[int] = 1
    version: int
    """The client's PROTOCOL_VERSION."""
    resume_token: bytes
    """Empty for a new session (resuming a detached session is reserved for later versions)."""
    extensions: dict[str, str] = dataclasses.field(default_factory=dict)
    """Op extensions the client has loaded, name -> version (at most MAX_EXTENSIONS)."""


@dataclass(frozen=True, slots=True)
class Welcome:
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
class Upload:
    """Store a tensor under a client-chosen id (replacing any tensor with that id). No reply."""

    TAG: ClassVar[int] = 3
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
class RegisterGraph:
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
class ExecuteGraph:
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
class Read:
    """Ask for a tensor's value; answered by Data (or Error)."""

    TAG: ClassVar[int] = 6
    request_id: int
    """Client-chosen id the Data reply repeats."""
    tensor_id: int
    """The tensor to read."""


@dataclass(frozen=True, slots=True)
class Data:
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
class Drop:
    """Forget tensors. No reply."""

    TAG: ClassVar[int] = 8
    tensor_ids: tuple[int, ...]
    """Ids to forget; unknown ids are ignored."""


@dataclass(frozen=True, slots=True)
class Sync:
    """Barrier: answered by Ack once every earlier message was processed."""

    TAG: ClassVar[int] = 9
    request_id: int
    """Client-chosen id the Ack repeats."""


@dataclass(frozen=True, slots=True)
class Ack:
    """Answer to Sync."""

    TAG: ClassVar[int] = 10
    request_id: int
    """The Sync's request id."""


@dataclass(frozen=True, slots=True)
class Error:
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
class MemoryStats:
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


@dataclass(frozen=True, slots=True)
class Resync:
    """Client -> server after UNKNOWN_GRAPH: leave the stalled state; the client then resends
    RegisterGraph and every message from the failed ExecuteGraph on. No reply."""

    TAG: ClassVar[int] = 13


@dataclass(frozen=True, slots=True)
class Expose:
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
class Token:
    """Source server -> client: the capability granted by Expose."""

    TAG: ClassVar[int] = 15
    request_id: int
    """The Expose's request id."""
    token: bytes
    """32 random bytes; valid once, only for the peer named in Expose."""


@dataclass(frozen=True, slots=True)
class Fetch:
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
class Bulk:
    """First frame of a bulk stream; raw-bytes frames of at most BULK_CHUNK follow, covering
    ``offset`` up to ``size``. Answered on the same stream by BulkAck."""

    TAG: ClassVar[int] = 17
    bulk_id: int
    """The id an Upload or Data named."""
    size: int
    """Length of the whole transfer in bytes."""
    offset: int
    """Where this stream's bytes start: 0, or (after a lost link) the last offset the
    receiver acknowledged; never beyond it."""


@dataclass(frozen=True, slots=True)
class BulkAck:
    """Receiver -> sender, on the bulk stream: bytes ``0..received`` are in the destination
    buffer. Sent at least every BULK_ACK_EVERY bytes and once the transfer is whole."""

    TAG: ClassVar[int] = 18
    bulk_id: int
    """The transfer."""
    received: int
    """Bytes of the transfer held by the receiver, counted from 0."""


# --- device groups and collectives (tags 60..69) ------------------------------------------
MAX_GROUP = 256
"""Most ranks in one device group (the length of GroupSetup.peers)."""
LINK_TIMEOUT = 3.0
"""Seconds of silence after which a server declares a ring neighbour dead or cut off (and
fails the group naming it): the bound on how long a dead rank goes unnoticed."""
LINK_BEAT = LINK_TIMEOUT / 6
"""Seconds between GroupBeat heartbeats on each group link."""
GROUP_MESSAGE = r"group (?P<group>[0-9a-f]{16}): rank (?P<rank>-?\d+) \((?P<peer>[^)]*)\): "
"""The start of an Error(GROUP) message (a regular expression): the group and the culprit."""


@dataclass(frozen=True, slots=True)
class GroupSetup:
    """Client -> server: this server is rank ``rank`` of group ``group_id``; answered by
    GroupReady. Its ring neighbours may then link to it presenting ``capability``."""

    TAG: ClassVar[int] = 60
    request_id: int
    """Client-chosen id the reply repeats."""
    group_id: int
    """Client-chosen, random, non-zero; the ``group`` attribute of the group's ops."""
    rank: int
    """This server's rank; ``peers[rank]`` must be its own peer id."""
    peers: tuple[str, ...]
    """Peer id of every rank, in rank order (1..MAX_GROUP, no repeats)."""
    capability: bytes
    """32 random bytes, the same for every rank: a link presenting them is of this group."""
    timeout_ms: int
    """How long a rank waits at a collective for the others (late ranks fail the group)."""


@dataclass(frozen=True, slots=True)
class GroupReady:
    """Server -> client: answer to GroupSetup."""

    TAG: ClassVar[int] = 61
    request_id: int
    """The GroupSetup's id."""
    device: str
    """The server's device (``cpu``, ``cuda:0``, ...): the client picks the engine from them."""


@dataclass(frozen=True, slots=True)
class GroupStart:
    """Client -> server, once every rank answered GroupSetup: link to the ring neighbours;
    answered by Ack once both links are up, or Error(GROUP) naming the rank that failed."""

    TAG: ClassVar[int] = 62
    request_id: int
    """Client-chosen id the reply repeats."""
    group_id: int
    """The group."""
    engine: str
    """``ring`` (the ring over the servers' links) or ``nccl`` (every rank on a GPU)."""


@dataclass(frozen=True, slots=True)
class GroupClose:
    """Client -> server: leave the group (its links close; ranks waiting fail). No reply."""

    TAG: ClassVar[int] = 63
    group_id: int
    """The group."""


@dataclass(frozen=True, slots=True)
class GroupLink:
    """Server -> server, first frame of the first stream of a link connection: rank ``rank``
    links to its ring successor. The successor answers with a GroupLink of its own rank and
    an empty capability, or with Error(CAPABILITY) and closes the connection."""

    TAG: ClassVar[int] = 64
    version: int
    """The sender's PROTOCOL_VERSION (the first field in every version from 3 on, so that
    servers of different versions name each other's instead of failing to decode)."""
    group_id: int
    """The group."""
    rank: int
    """The sender's rank."""
    capability: bytes
    """GroupSetup.capability (empty in the answer)."""
    ring_address: str
    """In the answer: where the successor takes this link's ring data over TCP
    (``HOST:PORT``, or ``:PORT`` for the host this QUIC link reached it at); empty when it
    has no TCP data plane (then the data goes on the link's second QUIC stream). Empty in
    the dial."""
    ring_key: bytes
    """In the answer, with ``ring_address``: 32 fresh random bytes, the AES-256-GCM key of
    this link's TCP data plane (it travels only inside this authenticated, encrypted QUIC
    link). Empty otherwise."""


@dataclass(frozen=True, slots=True)
class GroupBeat:
    """Server -> server on a link's first stream, both ways, every LINK_BEAT seconds: the
    sender is alive (LINK_TIMEOUT of silence fails the group, naming the silent rank). On a
    link whose ring data goes over TCP it also says how far the data got, so a TCP data link
    that stops carrying bytes while both QUIC ends still beat is found (a cut TCP path)."""

    TAG: ClassVar[int] = 65
    group_id: int
    """The group."""
    data: int
    """TCP data plane only (else 0): from the dialler, the ring-data bytes it has written to
    the TCP link; from the successor, the bytes it has read from it."""
    waiting: int
    """From the successor, 1 while its receiver has waited on the TCP data link with nothing
    arriving for over LINK_BEAT during an all-reduce; 0 otherwise."""


@dataclass(frozen=True, slots=True)
class GroupAbort:
    """Server -> server on a link's first stream: the group failed because of rank ``rank``;
    the receiver fails it the same way and forwards this on its other link."""

    TAG: ClassVar[int] = 66
    group_id: int
    """The group."""
    rank: int
    """The culprit."""
    reason: str
    """Why (for people)."""


@dataclass(frozen=True, slots=True)
class RingHeader:
    """First frame of one all-reduce on a link's data stream (the second stream the dialling
    rank opens; data flows from it to its successor); the pieces follow as raw-bytes frames
    in the order of the ring schedule (``engine/collective/ring.py``)."""

    TAG: ClassVar[int] = 67
    seq: int
    """The collective's number in the group (0, 1, ...): every rank's k-th call meet."""
    dtype: str
    """Wire dtype of the tensor."""
    count: int
    """Elements of the (flattened) tensor."""
    op: str
    """``sum`` or ``mean``."""


@dataclass(frozen=True, slots=True)
class NcclId:
    """Server -> server on a link's first stream (engine ``nccl``): rank 0's NCCL unique id,
    passed along the ring so that every rank creates the same communicator."""

    TAG: ClassVar[int] = 68
    group_id: int
    """The group."""
    unique_id: bytes
    """``cupy.cuda.nccl.get_unique_id()`` as bytes (128)."""


@dataclass(frozen=True, slots=True)
class RingPlane:
    """Server -> server on a link's first stream, once, from the dialler after GroupLink:
    where this link's ring data will go. The successor counts the link as up only then."""

    TAG: ClassVar[int] = 69
    group_id: int
    """The group."""
    plane: str
    """``tcp`` (the TCP data plane the answer's ``ring_address`` named, authenticated with
    its ``ring_key``) or ``quic`` (the link's second QUIC stream)."""
    reason: str
    """Why ``quic`` (the TCP attempt's error, or that the successor offered none); empty
    for ``tcp``."""


RING_PLANES = ("tcp", "quic")
"""Where a group link's ring data can go (RingPlane.plane)."""
RING_MAGIC = b"burnring"
"""First 8 bytes the dialler sends on a TCP ring data link (section 12)."""
RING_HELLO = b"ring data link"
"""Plain text the first sealed records of a TCP ring data link carry, both ways."""
RING_TAG = 16
"""Bytes of AES-GCM tag after each sealed record of a TCP ring data link."""
RING_MAX_HEADER = 4096
"""Largest sealed RingHeader record a TCP ring data link accepts."""
RING_CONNECT_TIMEOUT = 3.0
"""Seconds the dialler gives a TCP ring data link to connect and authenticate before it
falls back to the QUIC stream."""
RING_SHARED_OFFSET = 4096
"""Where the ring buffer starts in a shared-memory link's segment (mode 2, section 12);
the segment's first 16 bytes are the dialler's nonce."""
RING_SHARED_BYTES = 16 * 1024 * 1024
"""Bytes of a shared-memory link's ring buffer (mode 2, section 12)."""
RING_SHARED_ALIGN = 8
"""On a shared-memory link a RingHeader record is followed by zero bytes up to a multiple of
this in the link's byte stream, so every all-reduce's pieces start aligned in the buffer
(the successor adds them to its input where they lie, section 12)."""

GROUP_MESSAGES = (GroupSetup, GroupReady, GroupStart, GroupClose)
"""The client's group messages (server-to-server ones: GroupLink, GroupBeat, GroupAbort,
RingHeader, NcclId, RingPlane)."""


# --- jobs (server/jobs; tags 40..49 are reserved for them) -----------------------------------
JOB_PAGE = 100
"""Most jobs one JobList reply holds (a job row with its spec is at most ~MAX_SPEC bytes of
JSON, but specs are small in practice; the server also cuts a page at MAX_FRAME / 2 bytes)."""
ARTIFACT_CHUNK = 1024 * 1024
"""Largest ``data`` of one ArtifactPut or ArtifactChunk (artifacts move in chunks inline)."""
MAX_SPEC = 1024 * 1024
"""Largest JSON job spec a server accepts."""


@dataclass(frozen=True, slots=True)
class JobSubmit:
    """Queue a job; answered by JobInfo (the new job) or Error(JOB) naming the bad key."""

    TAG: ClassVar[int] = 40
    request_id: int
    """Client-chosen id the reply repeats."""
    spec: bytes
    """The job spec as UTF-8 JSON (a TOML spec is parsed by the client); at most MAX_SPEC."""


@dataclass(frozen=True, slots=True)
class JobInfo:
    """Server -> client: answer to JobSubmit, JobList, JobStatus and JobCancel."""

    TAG: ClassVar[int] = 41
    request_id: int
    """The request's id."""
    info: bytes
    """UTF-8 JSON: one job (id, kind, state, step, total, outputs, error...) or, for JobList,
    an array of them."""


@dataclass(frozen=True, slots=True)
class JobList:
    """One page of the server's jobs, oldest first; answered by JobInfo whose ``info`` is
    ``{"jobs": [...], "next": ID or null}``: ask again with ``after = next`` for the next
    page (null: that was the last). Pages keep every reply under the frame limit."""

    TAG: ClassVar[int] = 42
    request_id: int
    """Client-chosen id the reply repeats."""
    after: int
    """List jobs with ids above this (0: from the first)."""
    limit: int
    """Jobs wanted (0 or more than the server's page size: the page size, JOB_PAGE)."""


@dataclass(frozen=True, slots=True)
class JobStatus:
    """One job's row; answered by JobInfo."""

    TAG: ClassVar[int] = 43
    request_id: int
    """Client-chosen id the reply repeats."""
    job_id: int
    """The job."""


@dataclass(frozen=True, slots=True)
class JobCancel:
    """Cancel a queued or running job (a running one stops at its next step and keeps its
    last checkpoint); answered by JobInfo."""

    TAG: ClassVar[int] = 44
    request_id: int
    """Client-chosen id the reply repeats."""
    job_id: int
    """The job."""


@dataclass(frozen=True, slots=True)
class JobWatch:
    """Long poll: answered by JobEvents as soon as the job has events numbered above
    ``after`` (or after a couple of seconds with none)."""

    TAG: ClassVar[int] = 45
    request_id: int
    """Client-chosen id the reply repeats."""
    job_id: int
    """The job."""
    after: int
    """The last event sequence number the client has seen (0: from the start)."""


@dataclass(frozen=True, slots=True)
class JobEvents:
    """Server -> client: answer to JobWatch."""

    TAG: ClassVar[int] = 46
    request_id: int
    """The JobWatch's id."""
    job_id: int
    """The job."""
    events: bytes
    """UTF-8 JSON array of events in order, each with ``seq``, ``state`` and, for progress,
    ``step``, ``total``, ``loss``, ``steps_per_s``, ``eta_s``."""


@dataclass(frozen=True, slots=True)
class ArtifactPut:
    """One chunk of an artifact upload, in order; every chunk is answered by Ack. The last
    chunk (``offset + len(data) == total``) is checked against ``digest`` before it is
    stored; a mismatch is refused with Error(JOB)."""

    TAG: ClassVar[int] = 47
    request_id: int
    """Client-chosen id the Ack repeats."""
    digest: bytes
    """sha256 (32 bytes) of the whole artifact; names it on the server."""
    offset: int
    """Where this chunk starts; chunks arrive in order from 0."""
    total: int
    """Size of the whole artifact."""
    data: bytes
    """At most ARTIFACT_CHUNK bytes."""


@dataclass(frozen=True, slots=True)
class ArtifactGet:
    """Read a chunk of a stored artifact (job input or output); answered by ArtifactChunk."""

    TAG: ClassVar[int] = 48
    request_id: int
    """Client-chosen id the reply repeats."""
    digest: bytes
    """sha256 of the artifact."""
    offset: int
    """First byte wanted."""
    length: int
    """Bytes wanted (the server sends at most ARTIFACT_CHUNK)."""


@dataclass(frozen=True, slots=True)
class ArtifactChunk:
    """Server -> client: answer to ArtifactGet; the client checks the sha256 of the whole."""

    TAG: ClassVar[int] = 49
    request_id: int
    """The ArtifactGet's id."""
    digest: bytes
    """sha256 the server holds the artifact under."""
    offset: int
    """Where ``data`` starts."""
    total: int
    """Size of the whole artifact."""
    data: bytes
    """The chunk."""


@dataclass(frozen=True, slots=True)
class ServerStatus:
    """Ask for the server's status (sessions, memory, plan cache, jobs, errors); answered by
    StatusInfo, or Error(FORBIDDEN) unless the peer is an admin or the server itself."""

    TAG: ClassVar[int] = 50
    request_id: int
    """Client-chosen id the reply repeats."""


@dataclass(frozen=True, slots=True)
class StatusInfo:
    """Server -> client: answer to ServerStatus."""

    TAG: ClassVar[int] = 51
    request_id: int
    """The request's id."""
    info: bytes
    """UTF-8 JSON object: ``peer_id``, ``device``, ``uptime_s``, ``sessions`` (one row each),
    ``memory``, ``plan_cache``, ``jobs``, ``errors`` (see ``server/_status.py``)."""


JOB_MESSAGES = (
    JobSubmit,
    JobInfo,
    JobList,
    JobStatus,
    JobCancel,
    JobWatch,
    JobEvents,
    ArtifactPut,
    ArtifactGet,
    ArtifactChunk,
)
"""The job and artifact messages (see server/jobs and protocol/README.md)."""


Message = (
    Hello
    | Welcome
    | Upload
    | RegisterGraph
    | ExecuteGraph
    | Read
    | Data
    | Drop
    | Sync
    | Ack
    | Error
    | MemoryStats
    | Resync
    | Expose
    | Token
    | Fetch
    | Bulk
    | BulkAck
    | JobSubmit
    | JobInfo
    | JobList
    | JobStatus
    | JobCancel
    | JobWatch
    | JobEvents
    | ArtifactPut
    | ArtifactGet
    | ArtifactChunk
    | ServerStatus
    | StatusInfo
    | GroupSetup
    | GroupReady
    | GroupStart
    | GroupClose
    | GroupLink
    | GroupBeat
    | GroupAbort
    | RingHeader
    | NcclId
    | RingPlane
)
MESSAGES: dict[int, type] = {
    c.TAG: c
    for c in (
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
        Bulk,
        BulkAck,
        *JOB_MESSAGES,
        ServerStatus,
        StatusInfo,
        *GROUP_MESSAGES,
        GroupLink,
        GroupBeat,
        GroupAbort,
        RingHeader,
        NcclId,
        RingPlane,
    )
}

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
        (f.name, _BY_NAME.get(f.name) or _CHECKS[f.type], f"({cls.__name__}).{f.name}")
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
    packer: msgpack.Packer, tensor_id: int, dtype: str, shape: Any, data: Any
) -> bytes:
    """``encode_one(Upload(tensor_id, dtype, shape, data, 0))`` without building the message:
    ``data`` may be any buffer (an array's memory), packed as bin without a copy first. The
    field order is Upload's, kept here beside its class (the step's hot path)."""
    return packer.pack((Upload.TAG, tensor_id, dtype, shape, data, 0))


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
    n, build = _BUILDERS[cls]
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


_BUILDERS = {cls: _builder(cls) for cls in MESSAGES.values()}
_BUILDERS_BY_TAG = {tag: _BUILDERS[cls] for tag, cls in MESSAGES.items()}


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
    builders = _BUILDERS_BY_TAG
    for i, raw in enumerate(_unpack_frame(frame)):
        if type(raw) is list and raw and type(raw[0]) is int:  # the common case, at once
            entry = builders.get(raw[0])
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
        return decode_message(one, "GroupLink")  # names what it is instead
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
