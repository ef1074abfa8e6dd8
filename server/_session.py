"""One client's session, sans I/O: control frames, bulk payloads and the time in; frames
and actions out.

The QUIC glue (``_session_pump.py``) feeds frames and runs :meth:`Session.step` where the handler
table says (``_handlers.HANDLERS``: network loop, engine worker or job worker), one call at a
time per session, so a session's messages run in order while other sessions and the network
loop go on. The session never reads the clock: ``step`` takes ``now``. Tests drive the same
object in memory.
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import msgpack
import numpy as np

from ..engine.backends.cpu_memory import release_freed_memory
from ..engine.executor import Plan
from ..protocol import dtypes
from ..protocol import messages as m
from ..protocol.bulk import BulkReceive, BulkSend
from ._batch import RunLedger, start_run
from ._handlers import HANDLERS, read_alone
from ._replies import Failure, Place, SendBulk, StartFetch, Wait
from ._state import LimitExceeded, ServerState, nbytes_of, pop_all, replacement_cost

log = logging.getLogger("burn_remote.server")

_perf = time.perf_counter

RESUME_TOKEN_BYTES = 16
"""Random bytes of a resume token (128 bits): unguessable, and bound to the peer id too."""

Output = bytes | SendBulk | StartFetch
"""What ``step`` returns: control frames to send (in order) and actions for the glue."""

INLINE_BUDGET = 0.001
"""Seconds of engine work one step may do on the network loop instead of a worker thread,
judged before each message from ``Handler.inline`` (a plan's last run time). Handing a small
step to a thread and back costs more than the step (a digits-MLP step took ~1000 us of
server CPU through a thread, ~520 us inline); work not yet timed, or slower, always goes to
a worker, so the loop never stalls other sessions for longer than this."""

MAX_BULK_DONE = 4096
"""Consumed bulk ids a session remembers, so a transfer resent after a lost final BulkAck is
acknowledged instead of stored again."""

LONE_READ = bytes((0x91, 0x93, m.Read.TAG))
"""How a control frame holding one Read (``[[Read.TAG, request_id, tensor_id]]``, what
``item()`` sends) begins: ``Session.answer_alone`` answers it without the message machinery."""
LONE_READ_MAX = len(LONE_READ) + 2 * 9
"""Its longest encoding (two u64 fields)."""

ERROR_NAMES = {
    getattr(m, name): name.lower()
    for name in (
        "MALFORMED", "VERSION", "UNKNOWN_GRAPH", "BAD_GRAPH", "EXECUTION", "MISSING_TENSOR",
        "LIMIT", "STALLED", "CAPABILITY", "INTERNAL", "JOB", "SESSION_EXPIRED", "FORBIDDEN",
        "GROUP",
    )
}  # fmt: skip
"""Error code -> the kind metrics and logs name it by."""

_RUNS_AT = {
    None: tuple(Place),
    Place.LOOP: (Place.LOOP,),
    Place.ENGINE: (Place.LOOP, Place.ENGINE),
    Place.COMPILE: (Place.LOOP, Place.COMPILE),
    Place.JOBS: (Place.LOOP, Place.JOBS),
}
"""Which handlers a step running at a place may run (None: in-process callers, anything).
Tuples: membership compares identity first, where a set would hash an Enum in Python."""
_LOOP_ONLY = _RUNS_AT[Place.LOOP]
_RUN_STARTS = (m.Upload, m.ExecuteGraph)
"""Messages a run of replays (``_batch.start_run``) may start with."""
Queued = m.Message | m.Undecodable
"""A queued message: one that decoded, or one that did not (answered MALFORMED in its place)."""


MAX_FAILED_OUTPUTS = 65_536
"""Ids of tensors failed steps would have made, remembered per session (bounded)."""


class Session:
    """Tensor store and message interpreter of one client connection."""

    def __init__(self, state: ServerState, peer_id: str = "") -> None:
        self.state = state
        self.peer_id = peer_id
        self.id = 0
        self.resume_token = secrets.token_bytes(RESUME_TOKEN_BYTES)
        """Random token of the Welcome (never derived from the session id); with the peer id,
        the only key to resume this session (server/_resume.py)."""
        self.store: dict[int, Any] = {}
        self.nbytes = 0
        self.peak = 0
        self.refused: dict[str, tuple[int, str, int]] = {}
        self.failed_outputs: set[int] = set()
        """Ids a failed step would have stored (``note_failed``)."""
        """Digests this session registered and the server refused: executing one fails with the
        reason (error code, message, node) instead of asking the client to re-register."""
        self.graphs: set[str] = set()
        self.stalled = False
        self.closed = False
        """Set when the connection must end (bad version, session limit)."""
        self.greeted = False
        self.queue: deque[Queued] = deque()
        self.bulk_in: dict[int, Any] = {}
        """Whole transfers not yet used by their Upload: bulk id -> buffer (None: given up;
        a Failure: refused)."""
        self.bulk_partial: dict[int, BulkReceive] = {}
        """Transfers under way (kept while the session is parked, so they resume)."""
        self.bulk_reserved = 0
        """Bytes of transfers allocated and not yet stored as tensors (charged to the quota)."""
        self._bulk_lock = threading.Lock()
        """Guards ``bulk_reserved``: the network loop reserves, a worker thread releases."""
        self.bulk_done: set[int] = set()
        self.bulk_out: dict[int, BulkSend] = {}
        """Transfers to the client not yet wholly acknowledged."""
        self.fetched: dict[int, Any] = {}
        self.groups: dict[int, Any] = {}
        """Group id -> this session's member (``_group_service.MemberHandle``): the scope of its
        graphs' collectives."""
        self.group_bytes = 0
        """Bytes its groups keep for reuse (former all-reduce results; ``_group_buffers``), charged
        to its quota beside its tensors; refunded when the groups end."""
        self.waiting: tuple[str, int] | None = None
        """("bulk", bulk_id) or ("fetch", tensor_id) while ``step`` cannot go on."""
        self.opened: float | None = None
        """``now`` of the first step."""
        self.last_active = 0.0
        """``now`` of the latest step (the status command shows idle sessions)."""
        self.messages = 0
        """Messages handled (for the status command and metrics)."""
        self.traffic = [0, 0, 0]
        """Steps run, tensor bytes received and sent (metrics: ``ServerState.traffic``); the
        session's own, so a message bumps them without the ledger's lock."""
        self.packer = m.packer()
        """Encodes the replies built without message objects (one session steps in one
        thread at a time; the Packer's buffer is reused)."""
        self.planned: tuple[Any, Any] | None = None
        """(ExecuteGraph, its plan) as the handler table's ``inline`` found it deciding
        where the message runs, so its handler does not look the plan up again."""
        self.run: RunLedger | None = None
        """The ledger of the run of replays being handled (``_batch.start_run``): while
        set, ``put``, ``put_many``, ``drop`` and ``run_plan`` charge its reservation."""
        self.run_reserved = 0
        """Bytes a run of replays reserved and has not used yet: the peer's and this
        session's other checks count them as held."""
        self.run_skip = 0
        """Queued messages that cannot start a run of replays (the last scan's finding):
        the message path takes them without scanning the queue again."""
        self._replies: list[m.Message] = []
        self._out: list[Output] = []
        self._bulk_ids = 0

    # --- inputs -----------------------------------------------------------------------------
    def answer_alone(self, frame: bytes, now: float) -> bytes | None:
        """The reply frame to a control frame that is one Read of a small tensor, for an
        idle, greeted session (``item()``'s round trip, answered on the receive loop); the
        same bytes, counters and state as ``feed_control`` then ``step``, without decoding
        into message objects. None: any other frame or case (a missing or large tensor, a
        stalled session, a malformed frame), which the caller feeds the usual way."""
        if (
            len(frame) > LONE_READ_MAX
            or frame[:3] != LONE_READ
            or self.queue
            or self.waiting is not None
            or self.stalled
            or self.closed
            or not self.greeted
        ):
            return None
        try:
            ((_, rid, tid),) = msgpack.unpackb(frame)
        except (ValueError, TypeError, msgpack.UnpackException):
            return None
        if type(rid) is not int or type(tid) is not int or rid < 0 or tid < 0:
            return None
        reply = read_alone(self, rid, tid)
        if reply is not None:
            self.messages += 1
            self.last_active = now
        return reply

    def feed_control(self, frame: bytes | bytearray) -> None:
        """Queue a control frame's messages; a malformed frame is answered and skipped."""
        try:
            msgs = m.decode_each(frame)  # a bad message is answered in its place
        except m.DecodeError as exc:
            self._replies.append(m.Error(m.MALFORMED, str(exc), -1, 0))
            return
        self.queue.extend(msgs)

    def open_bulk(self, header: m.Bulk) -> BulkReceive | None:
        """The receiver of a bulk stream that ``header`` opens, allocated (and charged to the
        memory quota) on its first stream; None when that transfer is already whole.

        Raises:
            LimitExceeded: the transfer would not fit in the session's or server's memory.
        """
        bid = header.bulk_id
        if bid in self.bulk_in or bid in self.bulk_done:
            return None
        rx = self.bulk_partial.get(bid)
        if rx is None:
            self.reserve(header.size)
            rx = self.bulk_partial[bid] = BulkReceive(bid, header.size)
        return rx

    def reserve(self, size: int) -> None:
        """Charge ``size`` bytes about to arrive to the session's quota (``release`` undoes).

        Raises:
            LimitExceeded: they would not fit in the session's or the server's memory.
        """
        limits = self.state.limits
        with self._bulk_lock:
            held = self.nbytes + self.bulk_reserved + self.run_reserved
            if held + size > limits.session_memory:
                raise LimitExceeded(
                    f"a {size}-byte transfer exceeds the session memory quota: {held} bytes "
                    f"held or arriving, session_memory {limits.session_memory}"
                )
            # in the server's ledger too: every session's transfers count against the limit
            self.state.check_peer_memory(self.peer_id, size)
            self.state.hold(size, held, f"a {size}-byte transfer of session {self.id}")
            self.bulk_reserved += size

    def release(self, size: int) -> None:
        with self._bulk_lock:
            self.bulk_reserved -= size
            self.state.hold(-size)

    def feed_bulk(self, bulk_id: int, buffer: Any) -> None:
        """A transfer is whole (``buffer``), or the glue gave up waiting for it (None: what
        arrived of it is freed, nothing is stored)."""
        rx = self.bulk_partial.pop(bulk_id, None)
        if buffer is None and rx is not None:
            self.release(rx.size)
        self.bulk_in[bulk_id] = buffer

    def refuse_bulk(self, bulk_id: int, code: int, message: str) -> None:
        """A transfer was refused (over quota, malformed): its Upload fails with this error
        and nothing of it is kept."""
        rx = self.bulk_partial.pop(bulk_id, None)
        if rx is not None:
            self.release(rx.size)
        self.bulk_in[bulk_id] = Failure(code, message)

    def take_bulk(self, bulk_id: int) -> Any:
        """The whole transfer an Upload names (its reservation moves to the tensor).

        Raises:
            Failure: the transfer never came or was refused.
        """
        data = self.bulk_in.pop(bulk_id)
        if data is None:
            raise Failure(m.MALFORMED, f"bulk {bulk_id} of an Upload never arrived")
        if isinstance(data, Failure):
            raise data
        self.release(data.nbytes)
        if len(self.bulk_done) >= MAX_BULK_DONE:
            self.bulk_done = set(sorted(self.bulk_done)[MAX_BULK_DONE // 2 :])
        self.bulk_done.add(bulk_id)
        return data

    def send_bulk(self, data: Any, chunk: int) -> BulkSend:
        """A new transfer to the client, kept until it acknowledged all of it."""
        send = BulkSend(self.next_bulk_id(), data, chunk)
        self.bulk_out[send.bulk_id] = send
        return send

    def bulk_sent(self, bulk_id: int) -> None:
        """The client acknowledged all of an outgoing transfer."""
        self.bulk_out.pop(bulk_id, None)

    def being_sent(self, array: Any) -> bool:
        """Whether a transfer to the client still reads ``array``'s memory (it must then not
        be donated: the graph could overwrite it in place)."""
        if not self.bulk_out or not isinstance(array, np.ndarray):
            return False
        return any(np.may_share_memory(array, b.keep) for b in self.bulk_out.values())

    def feed_fetched(self, tensor_id: int, result: Any) -> None:
        """``result``: (dtype, shape, buffer) from the source server, the buffer reserved
        with ``reserve``; or an error string."""
        self.fetched[tensor_id] = result

    # --- processing -------------------------------------------------------------------------
    def place_of(self, msg: Queued, budget: float | None = None) -> Place:
        """Where ``msg`` runs: its handler's place, or the loop for engine work whose known
        cost fits ``budget``. Hello and unknown messages are answered on the loop."""
        handler = HANDLERS.get(type(msg)) if self.greeted else None
        return self._where(handler, msg, INLINE_BUDGET if budget is None else budget)[0]

    def _where(self, handler: Any, msg: Queued, budget: float) -> tuple[Place, float]:
        """(where ``msg`` runs, the loop time it takes there): ``handler.inline`` is asked
        once per message and place (an ExecuteGraph's answer also keeps its plan for the
        handler: ``_handlers.execute``)."""
        if handler is None:
            return Place.LOOP, 0.0
        if handler.inline is not None and handler.place is Place.ENGINE:
            cost = handler.inline(self, msg)
            if cost is not None and cost <= budget and (not cost or not self.state.fair.heavy):
                return Place.LOOP, cost
        return handler.place, 0.0

    def next_place(self) -> Place:
        """Where the next ``step`` should run: the place of the message at the head."""
        return self.place_of(self.queue[0]) if self.queue else Place.LOOP

    def ready(self) -> bool:
        """False while the head message waits for a bulk payload or a fetch."""
        if self.waiting is None:
            return True
        kind, key = self.waiting
        return key in (self.bulk_in if kind == "bulk" else self.fetched)

    def step(
        self, now: float, place: Place | None = None, slice_s: float | None = None
    ) -> list[Output]:
        """Run queued messages until done, blocked on a bulk payload or a fetch, or (with
        ``place``) at a message that must run elsewhere; ``now`` is the caller's clock.
        With ``slice_s`` it also stops, after one message at least, once that many seconds
        have passed (the engine's fair turn, ``_fair.SLICE``).

        Per message: one handler lookup, one ``inline`` question (only with ``place``), the
        handler; a message answered with nothing (Upload, ExecuteGraph, Drop) costs no
        more. A run of replays of one cached graph at the head (a captured loop's steps)
        is reserved in one go (``_batch.start_run``): its messages skip the ``inline``
        question and go through their handlers with their charges on the run's ledger.
        Hello, undecodable messages and a stalled session go through ``_dispatch``.

        On the loop, engine work (a timed step under INLINE_BUDGET, a run of replays) is
        left for a worker while a heavy engine turn runs (``_fair.FairShare.heavy``)."""
        if self.opened is None:
            self.opened = now
        self.last_active = now
        allowed = _RUNS_AT[place] if place is not Place.LOOP else _LOOP_ONLY
        budget = INLINE_BUDGET
        queue, handlers = self.queue, HANDLERS
        runs = place is not Place.JOBS and place is not Place.COMPILE and self.greeted
        ends = None if slice_s is None else _perf() + slice_s
        first = True
        run_left = 0  # messages of the run under way still to handle
        try:
            while queue and not self.closed:
                if budget < 0 and not run_left:  # the loop's budget ended a run: the rest
                    break  # is not the loop's
                if ends is not None and not run_left:
                    if not first and _perf() >= ends:
                        break
                    first = False
                msg = queue[0]
                if self.waiting is not None and not self.ready():
                    break
                if (
                    runs
                    and not run_left
                    and not self.run_skip
                    and not self.stalled
                    and type(msg) in _RUN_STARTS
                ):
                    left: float | None
                    if place is Place.LOOP:  # replays on the loop: not beside a heavy turn
                        left = 0.0 if self.state.fair.heavy else budget
                    else:
                        left = None if ends is None else max(0.0, ends - _perf())
                    run_left, spent = start_run(self, left)
                    budget -= spent
                handler = handlers.get(type(msg)) if self.greeted else None
                if run_left:  # placed with the run
                    run_left -= 1
                    if type(msg) is m.ExecuteGraph and self.run is not None:
                        self.planned = (msg, self.run.plan)
                elif place is not None:
                    where, cost = self._where(handler, msg, budget)
                    if where not in allowed:
                        break
                    if place is Place.LOOP:
                        budget -= cost
                queue.popleft()
                self.messages += 1
                if self.run_skip:
                    self.run_skip -= 1
                try:
                    if handler is None or self.stalled:
                        reply = self._dispatch(msg, now)
                    else:
                        reply = handler.run(self, msg, now)
                except Exception as exc:
                    if self.run is not None:  # the rest goes message by message
                        self.run.settle()
                        run_left = 0
                    self._fail(msg, exc)
                    continue
                if not run_left and self.run is not None:
                    self.run.settle()
                if reply is None:
                    self.waiting = None
                    continue
                if type(reply) is Wait:
                    queue.appendleft(msg)
                    if self.waiting != (reply.kind, reply.key) and reply.action is not None:
                        self._out.append(reply.action)
                    self.waiting = (reply.kind, reply.key)
                    if not self.ready():
                        break
                    continue
                self.waiting = None
                for out in reply:
                    if type(out) is SendBulk:
                        self._out.append(out)
                    else:
                        if type(out) is m.Error:
                            self._count(out)
                        self._replies.append(out)
        finally:
            if self.run is not None:  # (a BaseException through a handler)
                self.run.settle()
        return self._flush()

    def _fail(self, msg: Any, exc: Exception) -> None:
        """Answer ``msg``'s failure: a Failure or a limit as the client's error, anything
        else (a bug) as an internal error, logged; the session goes on."""
        self.waiting = None
        if isinstance(exc, Failure):
            err = m.Error(exc.code, str(exc), exc.node, _request_id(msg))
            if exc.consequence:  # the error it follows from was counted
                self._replies.append(err)
                return
        elif isinstance(exc, LimitExceeded):
            err = m.Error(m.LIMIT, str(exc), -1, _request_id(msg))
        else:  # a bug must not end the server or the session
            log.error(
                "internal error on %s",
                type(msg).__name__,
                exc_info=exc,
                extra={"event": "internal_error", "session": self.id, "peer": self.peer_id},
            )
            err = m.Error(m.INTERNAL, f"{type(exc).__name__}: {exc}", -1, _request_id(msg))
        self._count(err)
        self._replies.append(err)

    def _count(self, err: m.Error) -> None:
        """Every error answered is counted by code (metrics) and logged at debug level."""
        kind = ERROR_NAMES.get(err.code, str(err.code))
        self.state.count_error(kind)
        log.debug(
            "error %s: %s",
            kind,
            err.message,
            extra={"event": "error_reply", "session": self.id, "error": kind},
        )

    def _flush(self) -> list[Output]:
        out = self._out
        if self._replies:
            out.insert(0, m.encode(self._replies))
        self._replies, self._out = [], []
        return out

    def next_bulk_id(self) -> int:
        self._bulk_ids += 1
        return self._bulk_ids

    def _dispatch(self, msg: Queued, now: float) -> Any:
        if isinstance(msg, m.Undecodable):
            raise Failure(m.MALFORMED, msg.reason)
        if not self.greeted:
            return self._hello(msg)
        if self.stalled and not isinstance(msg, m.Resync | m.Upload):
            rid = _request_id(msg)
            if rid and not isinstance(msg, m.ExecuteGraph):
                raise Failure(m.STALLED, "session stalled after UNKNOWN_GRAPH; send Resync")
            return None
        handler = HANDLERS.get(type(msg))
        if handler is None:
            raise Failure(m.MALFORMED, f"{type(msg).__name__} is not a client request")
        return handler.run(self, msg, now)

    def _hello(self, msg: m.Message) -> list[m.Message]:
        if not isinstance(msg, m.Hello):
            raise Failure(m.MALFORMED, f"expected Hello first, got {type(msg).__name__}")
        if msg.version != m.PROTOCOL_VERSION:
            self.closed = True
            raise Failure(
                m.VERSION,
                f"the client speaks protocol version {msg.version}, this server version "
                f"{m.PROTOCOL_VERSION} (upgrade the older side)",
            )
        try:
            self.id = self.state.open_session(self)
        except LimitExceeded:
            self.closed = True
            raise
        self.greeted = True
        log.info(
            "session %d opened",
            self.id,
            extra={"event": "session_opened", "session": self.id, "peer": self.peer_id},
        )
        return [self.state.welcome(self.id, self.resume_token)]

    # --- tensor store -----------------------------------------------------------------------
    def put(self, tensor_id: int, array: Any) -> None:
        """Store one tensor (an Upload): ``put_many`` without the batch around it."""
        if self.run is not None and self.run.store({tensor_id: array}):
            return
        old = self.store.get(tensor_id)
        delta = int(getattr(array, "nbytes", 0)) - (0 if old is None else nbytes_of(old))
        self._charge(0 if old is not None else 1, delta, 0)
        self.store[tensor_id] = array
        self.nbytes += delta
        if self.nbytes > self.peak:
            self.peak = self.nbytes

    def put_many(self, items: Iterable[tuple[int, Any]], release: int = 0) -> None:
        """Store tensors (replacing any with the same id), charging the quotas once: all are
        stored or, past a limit, none. ``release``: bytes held for the run that made them
        (``ServerState.run(release=False)``), returned in the same ledger update, stored or
        not. Inside a run of replays there is no arena held (the run's reservation holds
        it): ``release`` is then ignored."""
        new_items = dict(items)
        run = self.run
        if run is not None:
            if run.store(new_items):
                return
            release = 0  # the run has settled: its reservation held the arena
        store = self.store
        added, delta = replacement_cost(store, new_items.items())
        self._charge(added, delta, release)
        store.update(new_items)
        self.nbytes += delta
        if self.nbytes > self.peak:
            self.peak = self.nbytes

    def _charge(self, added: int, delta: int, release: int) -> None:
        """One ledger update for tensors about to be stored: the session's tensor count, its
        peer's cap, its quota and the server's limit (``ServerState.account``)."""
        store, state = self.store, self.state
        limit = state.limits.max_tensors
        if added and len(store) + added > limit:
            if release:
                state.hold(-release)
            raise LimitExceeded(
                f"session holds {len(store)} tensors and {added} more would exceed "
                f"max_tensors {limit}"
            )
        try:
            owner_bytes = self.nbytes + self.group_bytes
            state.account(added, delta, owner_bytes, peer=self.peer_id, release=release)
        except LimitExceeded:
            if not self.group_bytes:
                raise
            self.shed_group_buffers()  # tensors first: kept buffers only save page zeroing
            state.account(added, delta, self.nbytes + self.group_bytes, peer=self.peer_id)

    def shed_group_buffers(self) -> None:
        """Free the buffers this session's groups keep for reuse (and their charge)."""
        for handle in list(self.groups.values()):
            handle.member.buffers.shed()

    def drop(self, ids: Iterable[int]) -> None:
        if self.run is not None:
            self.run.drop(ids)
            return
        count, freed = pop_all(self.store, ids)
        if count:
            self.nbytes -= freed
            self.state.account(-count, -freed, self.nbytes)

    def run_plan(
        self, plan: Plan, inputs: list[Any], values: Any, donated: list[int], owner_bytes: int
    ) -> list[Any]:
        """Run a plan for this session: ``ServerState.run`` holding its arena until the
        outputs' charge returns it (``put_many(release=...)``), or, inside a run of replays,
        on the run's reservation."""
        if self.run is not None:
            return self.run.run_plan(plan, inputs, values, donated)
        return self.state.run(
            plan, inputs, values, donated, owner_bytes, f"session {self.id}", False
        )

    def get(self, tensor_id: int) -> Any:
        try:
            return self.store[tensor_id]
        except KeyError:
            if tensor_id in self.failed_outputs:
                raise Failure(
                    m.MISSING_TENSOR,
                    f"tensor {tensor_id} was not made: the step that makes it failed (its "
                    "error was answered before)",
                    consequence=True,
                ) from None
            raise Failure(
                m.MISSING_TENSOR, f"tensor {tensor_id} does not exist in this session"
            ) from None

    def note_failed(self, output_ids: tuple[int, ...]) -> None:
        """A step failed: the tensors it would have stored are remembered (up to
        MAX_FAILED_OUTPUTS), so that reading one is told why and not counted as a second
        error."""
        if len(self.failed_outputs) + len(output_ids) > MAX_FAILED_OUTPUTS:
            self.failed_outputs.clear()
        self.failed_outputs.update(output_ids)

    def close(self) -> None:
        """Free everything this session holds (the client went away)."""
        freed = self.nbytes
        self.drop(tuple(self.store))
        self.bulk_in.clear()
        self.bulk_partial.clear()
        self.bulk_out.clear()
        self.fetched.clear()
        if self.groups and self.state.collectives is not None:
            self.state.collectives.close_session(self)
        with self._bulk_lock:
            self.state.hold(-self.bulk_reserved)
            self.bulk_reserved = 0
        self.state.release_plans(self.id, self.graphs)
        self.state.close_session(self.id)
        release_freed_memory()  # what the CPU engine's malloc kept for this session's steps
        if self.greeted:
            log.info(
                "session %d closed after %d messages, %d bytes freed",
                self.id,
                self.messages,
                freed,
                extra={"event": "session_closed", "session": self.id, "peer": self.peer_id},
            )
            self.greeted = False  # closing twice logs once

    def array(self, dtype: str, shape: tuple[int, ...], data: Any) -> Any:
        """A backend array from wire bytes, without a copy on the CPU backend: a bulk buffer
        becomes the tensor as it is, and so does an inline ``bytes`` object (immutable: the
        tensor is a read-only view of it, as kernels never write their inputs); any other
        buffer (a view into something else) is copied."""
        try:
            dt = dtypes.to_numpy(dtype)
        except TypeError as exc:
            raise Failure(m.MALFORMED, str(exc)) from None
        count = math.prod(shape)  # Python ints: a product past 2**64 cannot wrap to a match
        if count * dt.itemsize != len(data):
            raise Failure(
                m.MALFORMED,
                f"{dtype}{list(shape)} needs {count * dt.itemsize} bytes, got {len(data)}",
            )
        if isinstance(data, np.ndarray):
            host = data.view(dt).reshape(shape)
        elif type(data) is bytes:  # the decoded message's own bytes: nothing else holds them
            host = np.ndarray(shape, dt, data)
        else:
            host = np.frombuffer(data, dtype=dt).reshape(shape).copy()
        return self.state.backend.from_numpy(host)


def _request_id(msg: m.Message) -> int:
    return getattr(msg, "request_id", 0)


__all__ = ["Output", "SendBulk", "Session", "StartFetch"]
