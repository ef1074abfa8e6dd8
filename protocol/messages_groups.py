"""Device groups and collectives: the client's group setup, the links between servers and the
ring data plane's constants (tags 60..69; protocol/README.md sections 11-12).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .messages_base import WireMessage

MAX_GROUP = 256
"""Most ranks in one device group (the length of GroupSetup.peers)."""
LINK_TIMEOUT = 3.0
"""Seconds of silence after which a server declares a ring neighbour dead or cut off (and
fails the group naming it): the bound on how long a dead rank goes unnoticed."""
LINK_BEAT = LINK_TIMEOUT / 6
"""Seconds between GroupBeat heartbeats on each group link."""
GROUP_MESSAGE = r"group (?P<group>[0-9a-f]{16}): rank (?P<rank>-?\d+) \((?P<peer>[^)]*)\): "
"""The start of an Error(GROUP) message (a regular expression): the group and the culprit."""
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


@dataclass(frozen=True, slots=True)
class GroupSetup(WireMessage):
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
class GroupReady(WireMessage):
    """Server -> client: answer to GroupSetup."""

    TAG: ClassVar[int] = 61
    request_id: int
    """The GroupSetup's id."""
    device: str
    """The server's device (``cpu``, ``cuda:0``, ...): the client picks the engine from them."""


@dataclass(frozen=True, slots=True)
class GroupStart(WireMessage):
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
class GroupClose(WireMessage):
    """Client -> server: leave the group (its links close; ranks waiting fail). No reply."""

    TAG: ClassVar[int] = 63
    group_id: int
    """The group."""


@dataclass(frozen=True, slots=True)
class GroupLink(WireMessage):
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
class GroupBeat(WireMessage):
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
class GroupAbort(WireMessage):
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
class RingHeader(WireMessage):
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
class NcclId(WireMessage):
    """Server -> server on a link's first stream (engine ``nccl``): rank 0's NCCL unique id,
    passed along the ring so that every rank creates the same communicator."""

    TAG: ClassVar[int] = 68
    group_id: int
    """The group."""
    unique_id: bytes
    """``cupy.cuda.nccl.get_unique_id()`` as bytes (128)."""


@dataclass(frozen=True, slots=True)
class RingPlane(WireMessage):
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


GROUP_MESSAGES = (GroupSetup, GroupReady, GroupStart, GroupClose)
"""The client's group messages (server-to-server ones: GroupLink, GroupBeat, GroupAbort,
RingHeader, NcclId, RingPlane)."""


GROUP_WIRE: tuple[type[WireMessage], ...] = (
    GroupSetup,
    GroupReady,
    GroupStart,
    GroupClose,
    GroupLink,
    GroupBeat,
    GroupAbort,
    RingHeader,
    NcclId,
    RingPlane,
)
"""Every message declared here, in tag order (``messages.MESSAGES`` joins the tables)."""
