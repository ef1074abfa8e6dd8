"""The client half of the wire protocol, sans I/O: batching, request ids, replies, replay.

Calls from the user's thread queue messages; nothing is sent until a result is awaited or a
batch passes a count or byte bound. ``take()`` hands the link a batch (one control frame, plus
bulk payloads); ``receive_control``/``receive_bulk`` take the server's frames. Every message
sent since the last answered request is kept in a journal, so when the server says
UNKNOWN_GRAPH (its plan cache evicted a graph) the protocol re-registers the graph and resends
the journal from that execution on, and the user never notices. Not thread-safe by itself:
the runtime holds one lock around every call.
"""

from __future__ import annotations

import math
import struct
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from burn_remote.protocol import dtypes
from burn_remote.protocol import messages as m

from ._group_error import group_error
from ._recorder import OpFailed, op_failure

if TYPE_CHECKING:
    import msgpack


class RemoteError(ConnectionError):
    """The connection to the server failed or closed; the device cannot go on.

    (Defined here, below both the remote device and the jobs client that raise it.)"""


BATCH_MAX_MESSAGES = 512
"""A batch with this many messages is sent without waiting for a read."""
BATCH_MAX_BYTES = 1 << 20
"""A batch with this many inline bytes is sent without waiting for a read."""
JOURNAL_MAX = 2048
"""Past this many unanswered messages a Sync is queued so the journal can be trimmed."""
MAX_KNOWN_GRAPHS = 4096
"""Digests remembered as registered; forgetting one only costs a re-registration."""
_ITEM_FORMATS = {
    name: struct.Struct("<" + code)
    for name, code in (
        ("bool", "?"),
        ("int8", "b"),
        ("uint8", "B"),
        ("int32", "i"),
        ("int64", "q"),
        ("float16", "e"),
        ("float32", "f"),
        ("float64", "d"),
    )
}
"""A one-element Data's bytes (little-endian, see protocol/README.md) -> the Python number
``ndarray.item()`` gives; bfloat16 has no struct code and goes through NumPy."""


@dataclass(slots=True)
class Counters:
    """What ``dev.stats()`` reports for a remote device."""

    messages_sent: int = 0
    bytes_sent: int = 0
    data_bytes_sent: int = 0
    messages_received: int = 0
    bytes_received: int = 0
    data_bytes_received: int = 0
    graphs_registered: int = 0
    replays: int = 0
    reregistrations: int = 0
    errors: int = 0
    bulk_resumed: int = 0
    """Transfers continued on a new connection after a lost link (from their last ack)."""


class _Entry:
    """A queued (then journaled) message: the message object, or for the messages a step
    sends (inline Upload, ExecuteGraph) its bytes, encoded when it was queued."""

    __slots__ = ("msg", "bulk", "raw", "kind", "rid")

    def __init__(
        self,
        msg: m.Message | None,
        bulk: tuple[int, bytes] | None = None,
        raw: bytes | None = None,
        kind: type | None = None,
        rid: int = 0,
    ) -> None:
        self.msg = msg
        self.bulk = bulk
        """(bulk id, payload) of an Upload whose payload goes on its own stream."""
        self.raw = raw
        """The message's bytes within a frame (``messages.encode_one``), once encoded."""
        self.kind = type(msg) if kind is None else kind
        self.rid: int = getattr(msg, "request_id", 0) if msg is not None else rid
        """Its request id; 0 for a message without one."""

    def encoded(self, packer: msgpack.Packer) -> bytes:
        """The message's bytes within a frame, encoded on first need (an entry is built with
        its message, or with its bytes when there is none)."""
        if self.raw is None:
            assert self.msg is not None, "an entry without a message is built with its bytes"
            self.raw = m.encode_one(self.msg, packer)
        return self.raw


@dataclass(slots=True)
class _InFlight:
    """What an execution awaiting its outcome keeps: the graph (re-registered if the server
    evicted it) and each node's op and recording line (for an error naming them). Not the
    whole capture: those stay alive for up to a read's worth of steps, and hundreds of
    objects a step kept that long made the garbage collector's full passes frequent."""

    digest: str
    graph: Any
    ops: tuple[str, ...]
    wheres: tuple[tuple[str, int], ...]

    def where(self, node: int) -> tuple[str, int] | None:
        return self.wheres[node] if 0 <= node < len(self.wheres) else None


@dataclass(slots=True)
class Batch:
    """What the link sends next: one control frame, then bulk transfers."""

    frame: bytes | bytearray
    bulk: list[tuple[int, bytes]] = field(default_factory=list)


class ClientProtocol:
    """One session's client state machine."""

    def __init__(self) -> None:
        self.counters = Counters()
        self.pending: list[_Entry] = [_Entry(m.Hello(m.PROTOCOL_VERSION, b""))]
        self.pending_bytes = 0
        self.journal: deque[_Entry] = deque()
        self.known: set[bytes] = set()
        self.in_flight: dict[int, _InFlight] = {}
        """request id -> executions not yet known to have succeeded."""
        self.results: dict[int, Any] = {}
        self.errors: list[OpFailed] = []
        self._welcome: m.Welcome | None = None
        self._bulk_threshold = m.BULK_THRESHOLD
        self._batch_bytes = min(BATCH_MAX_BYTES, m.MAX_FRAME // 2)
        self._digests: dict[str, bytes] = {}
        """Hex digest -> wire digest of the graphs executed lately (a replay converts none)."""
        self.fatal: str | None = None
        self._drops: list[int] = []
        self._rid = 0
        self.last_asked = 0
        """The last request that gets a reply (not an ExecuteGraph, answered only on failure)."""
        self._bulk = 0
        self._data_waiting: dict[int, m.Data] = {}
        self._bulk_early: dict[int, bytes] = {}
        self._resend = False
        self._flight: _InFlight | None = None
        """The last execution's record (the next one of the same replay reuses it)."""
        self._packer = m.packer()
        """Encodes messages as ``messages.encode`` does, one at a time, reusing its buffer."""
        self._item_reads: set[int] = set()
        """Reads whose reply is kept as the Python number of its one element (``item()``)."""

    # --- queueing (user thread) -------------------------------------------------------------
    def _next_rid(self) -> int:
        self._rid += 1
        return self._rid

    def _queue(self, msg: m.Message, size: int = 0) -> None:
        self.pending.append(_Entry(msg))
        self.pending_bytes += size

    @property
    def welcome(self) -> m.Welcome | None:
        """The server's Welcome (its limits size batches and bulk transfers)."""
        return self._welcome

    @welcome.setter
    def welcome(self, msg: m.Welcome | None) -> None:
        self._welcome = msg
        limits = msg.limits if msg is not None else {}
        self._bulk_threshold = min(m.BULK_THRESHOLD, limits.get("bulk_threshold", m.BULK_THRESHOLD))
        self._batch_bytes = min(BATCH_MAX_BYTES, limits.get("max_frame", m.MAX_FRAME) // 2)

    @property
    def bulk_threshold(self) -> int:
        """Bytes above which a tensor moves on a bulk stream: what the server announced."""
        return self._bulk_threshold

    @property
    def batch_bytes(self) -> int:
        """Inline bytes after which a batch is sent: BATCH_MAX_BYTES, or less for a server
        with small frames."""
        return self._batch_bytes

    def upload(self, tensor_id: int, array: np.ndarray) -> None:
        """Queue an Upload of ``array`` as ``tensor_id``: inline in the control stream up to the
        bulk threshold, else as a bulk transfer on a stream of its own. The bytes are copied now
        (once), so the caller may change the array afterwards."""
        a = array if array.flags.c_contiguous else np.ascontiguousarray(array)
        name = dtypes.from_numpy(a.dtype)
        n = a.nbytes
        self.counters.data_bytes_sent += n
        if n > self._bulk_threshold:
            payload = a.tobytes()  # the one copy: the caller may change its array after this
            self._bulk += 1
            upload = m.Upload(0, tensor_id, name, a.shape, b"", self._bulk)
            self.pending.append(_Entry(upload, (self._bulk, payload)))
        else:  # encoded now, straight from the array's memory (the one copy)
            # (ml_dtypes' bfloat16 exports no buffer: its bits go as uint16, the same bytes)
            data = a.data if name != "bfloat16" else a.view(np.uint16).data
            raw = m.encode_inline_upload(self._packer, tensor_id, name, a.shape, data)
            self.pending.append(_Entry(None, None, raw, m.Upload))
            self.pending_bytes += n

    def execute(self, capture: Any) -> None:
        """Queue an ExecuteGraph for ``capture``, preceded by a RegisterGraph the first time this
        session sends its digest; pending drops and donated inputs ride on it. Remembers the ops and
        source lines under its request id, so a failure reported later names the user's line."""
        digest = self._digests.get(capture.digest)
        if digest is None:
            if len(self._digests) >= MAX_KNOWN_GRAPHS:
                self._digests.clear()
            digest = self._digests[capture.digest] = m.digest_bytes(capture.digest)
        if digest not in self.known:
            if len(self.known) >= MAX_KNOWN_GRAPHS:
                self.known.clear()
            graph = capture.graph.encode()
            self._queue(m.RegisterGraph(self._next_rid(), digest, graph), size=len(graph))
            self.known.add(digest)
            self.counters.graphs_registered += 1
        else:
            self.counters.replays += 1
        self._rid = rid = self._rid + 1
        ops, wheres = capture.provenance()
        flight = self._flight  # a compiled step's replays share one (same graph, same lines)
        if (
            flight is None
            or flight.ops is not ops
            or flight.wheres is not wheres
            or flight.digest != capture.digest
        ):
            flight = self._flight = _InFlight(capture.digest, capture.graph, ops, wheres)
        self.in_flight[rid] = flight
        # Donated inputs (no Tensor holds them) go in this message's drops: the server frees
        # them inside the graph instead of one step later.
        ids = capture.input_ids
        drops = self._drops
        if capture.donated:
            drops.extend([ids[k] for k in capture.donated])
        self._drops = []
        # encoded now: a step's message is a few lists of ids and values
        raw = m.encode_execute_graph(
            self._packer, rid, digest, ids, capture.values, capture.output_ids, drops
        )
        self.pending.append(_Entry(None, None, raw, m.ExecuteGraph, rid))

    def drop(self, ids: Any) -> None:
        """Batched: the ids ride on the next ExecuteGraph, or a Drop when a batch is sent."""
        self._drops.extend(ids)

    def request(self, kind: type, *fields: Any) -> int:
        """Queue a message that gets a reply (Read, Sync, MemoryStats, Expose); its id."""
        rid = self.last_asked = self._next_rid()
        self._queue(kind(rid, *fields))
        return rid

    def request_item(self, tensor_id: int) -> int:
        """Queue a Read whose result is the tensor's one element as a Python number (what
        ``item()`` returns), not an array: no NumPy call on the reply's path. Its id."""
        rid = self.request(m.Read, tensor_id)
        self._item_reads.add(rid)
        return rid

    def fetch(self, tensor_id: int, source_peer: str, token: bytes) -> None:
        """No address: the server finds ``source_peer`` itself (it refuses one we name)."""
        self._queue(m.Fetch(tensor_id, source_peer, "", token))

    def should_send(self) -> bool:
        """A batch this large goes out even though nothing waits for it."""
        return len(self.pending) >= BATCH_MAX_MESSAGES or self.pending_bytes >= self._batch_bytes

    # --- sending (link) -----------------------------------------------------------------------
    def take(self, reserve: int = 0) -> Batch | None:
        """The next batch to send, journaled; None when nothing is pending. ``reserve`` > 0:
        the frame is a bytearray with that many bytes free in front for the link's headers
        (``messages.frame_of``)."""
        if self._drops:
            self._queue(m.Drop(tuple(self._drops)))
            self._drops = []
        if len(self.journal) > JOURNAL_MAX and not any(e.kind is m.Sync for e in self.pending):
            self.request(m.Sync)
        if not self.pending:
            return None
        entries, self.pending, self.pending_bytes = self.pending, [], 0
        packer, encoded = self._packer, []
        for e in entries:
            encoded.append(e.encoded(packer))
        frame = m.frame_of(encoded, reserve)
        batch = Batch(frame)
        journal = self.journal
        for e in entries:
            if e.bulk is not None:  # the link keeps it until the server has all of it
                batch.bulk.append(e.bulk)
                e.bulk = None
            if e.kind is not m.Hello:
                journal.append(e)
        c = self.counters
        c.messages_sent += 1 + len(batch.bulk)
        c.bytes_sent += len(frame) - reserve + sum(len(p) for _, p in batch.bulk)
        return batch

    # --- receiving (link) ---------------------------------------------------------------------
    def receive_control(self, frame: bytes) -> None:
        """Decode one control-stream frame from the server and apply each message (replies, errors,
        read headers). A frame that does not decode makes the session fatal, never half-applied."""
        self.counters.messages_received += 1
        self.counters.bytes_received += len(frame)
        try:
            msgs = m.decode(frame)
        except m.DecodeError as exc:
            self.fatal = f"the server sent a malformed frame: {exc}"
            return
        for msg in msgs:
            self._on_message(msg)

    def receive_bulk(self, bulk_id: int, payload: Any) -> None:
        """A bulk payload (a read's bytes) arrived on stream ``bulk_id``: completes its read when the
        Data header came first, else is kept until it does."""
        self.counters.messages_received += 1
        self.counters.bytes_received += len(payload)
        header = self._data_waiting.pop(bulk_id, None)
        if header is None:
            self._bulk_early[bulk_id] = payload
        else:
            self._complete(header, payload)

    def _complete(self, msg: m.Data, payload: Any) -> None:
        """The read's array: a view of the bulk buffer the bytes were written into, or of the
        inline bytes."""
        self.counters.data_bytes_received += len(payload)
        rid = msg.request_id
        if rid in self._item_reads:
            self._item_reads.discard(rid)
            fmt = _ITEM_FORMATS.get(msg.dtype)
            if fmt is not None and len(payload) == fmt.size and math.prod(msg.shape) == 1:
                self.results[rid] = fmt.unpack_from(payload)[0]
                return
            a = np.frombuffer(payload, dtype=dtypes.to_numpy(msg.dtype)).reshape(msg.shape)
            self.results[rid] = a.reshape(()).item()
            return
        a = np.frombuffer(payload, dtype=dtypes.to_numpy(msg.dtype)).reshape(msg.shape)
        self.results[rid] = a if isinstance(payload, np.ndarray) else a.copy()

    def _answered(self, rid: int) -> None:
        """Every message up to request ``rid`` was processed: trim journal and in_flight."""
        j = self.journal
        if rid and j and j[-1].rid == rid:  # the usual reply: to the last request sent (a read)
            j.clear()
        else:
            while j:
                if j.popleft().rid == rid:
                    break
        if rid == self._rid and rid not in self.in_flight:  # nothing was queued after it
            self.in_flight.clear()
        else:
            for k in [k for k in self.in_flight if k < rid]:
                del self.in_flight[k]

    def _on_message(self, msg: m.Message) -> None:
        if isinstance(msg, m.Data):
            self._answered(msg.request_id)
            if msg.bulk_id:
                early = self._bulk_early.pop(msg.bulk_id, None)
                if early is None:
                    self._data_waiting[msg.bulk_id] = msg
                else:
                    self._complete(msg, early)
            else:
                self._complete(msg, msg.data)  # (which counts its bytes)
        elif isinstance(
            msg,
            m.Ack
            | m.Token
            | m.MemoryStats
            | m.JobInfo
            | m.JobEvents
            | m.ArtifactChunk
            | m.StatusInfo
            | m.GroupReady,
        ):
            self._answered(msg.request_id)
            self.results[msg.request_id] = msg
        elif isinstance(msg, m.Welcome):
            self.welcome = msg
        elif isinstance(msg, m.Error):
            self._on_error(msg)

    def _on_error(self, err: m.Error) -> None:
        if err.code == m.STALLED:
            return  # the request is in the journal and will be resent after Resync
        if err.code == m.UNKNOWN_GRAPH:
            self._replay(err.request_id)
            return
        self.counters.errors += 1
        if err.code == m.VERSION or (err.code == m.LIMIT and self.welcome is None):
            self.fatal = err.message
            return
        sent = self.in_flight.pop(err.request_id, None)
        if sent is not None:
            if err.node >= 0:
                op = sent.ops[err.node] if err.node < len(sent.ops) else "?"
                exc = op_failure(sent.where(err.node), op, err.message)
            else:
                exc = OpFailed(f"graph execution failed on the server: {err.message}")
            if err.code == m.GROUP:  # a collective failed: the error names the culprit rank
                exc = group_error(err.message, str(exc)[: -len(err.message)])
            self.errors.append(exc)
        elif err.request_id and err.request_id <= self._rid and _is_request(err):
            self.results[err.request_id] = (
                group_error(err.message) if err.code == m.GROUP else OpFailed(err.message)
            )
        else:
            self.errors.append(OpFailed(f"server error {err.code}: {err.message}"))

    def _replay(self, rid: int) -> None:
        """Re-register the evicted graph and resend the journal from its execution on."""
        entries = list(self.journal)
        start = next((i for i, e in enumerate(entries) if e.rid == rid), None)
        sent = self.in_flight.get(rid)
        if start is None or sent is None:
            self.fatal = f"server lost graph of request {rid} and it cannot be replayed"
            return
        self.counters.reregistrations += 1
        digest = m.digest_bytes(sent.digest)
        # Uploads are not resent: a stalled server still stores them (ids are never reused).
        keep = entries[:start]
        resend = [e for e in entries[start:] if e.kind is not m.Upload]
        self.journal = deque(keep)
        register = m.RegisterGraph(self._next_rid(), digest, sent.graph.encode())
        head = [_Entry(m.Resync()), _Entry(register)]
        self.pending = head + resend + self.pending
        self.known.add(digest)
        self._resend = True

    def take_resend(self) -> bool:
        """Whether a replay after UNKNOWN_GRAPH waits to be sent (the reader sends it)."""
        resend, self._resend = self._resend, False
        return resend and bool(self.pending)

    def take_errors(self) -> OpFailed | None:
        """The first server-side failure since the last call (others are summarised)."""
        if not self.errors:
            return None
        first, rest = self.errors[0], self.errors[1:]
        self.errors = []
        if rest:
            return OpFailed(f"{first} (and {len(rest)} later error(s): {rest[0]})")
        return first


def _is_request(err: m.Error) -> bool:
    return err.code in (
        m.MISSING_TENSOR,
        m.LIMIT,
        m.CAPABILITY,
        m.INTERNAL,
        m.MALFORMED,
        m.JOB,
        m.FORBIDDEN,
        m.GROUP,
    )


__all__ = ["Batch", "ClientProtocol", "Counters"]
