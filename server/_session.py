"""One client's session, sans I/O: control frames and bulk payloads in, frames and actions out.

The QUIC glue (``_daemon.py``) feeds frames and runs :meth:`Session.step` in a worker thread,
one call at a time per session, so a session's messages run in order while other sessions and
the network loop go on. Tests drive the same object in memory.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engine.executor import ExecutionError
from ..protocol import dtypes
from ..protocol import messages as m
from ..protocol.graph import GraphError
from ._state import LimitExceeded, ServerState

log = logging.getLogger("burn_remote.server")


@dataclass(frozen=True, slots=True)
class SendBulk:
    """Action: open a bulk stream, send ``Bulk{bulk_id}`` then ``payload``."""

    bulk_id: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class StartFetch:
    """Action: fetch a tensor from another server, then call ``feed_fetched``."""

    tensor_id: int
    source_peer: str
    source_address: str
    token: bytes


Output = bytes | SendBulk | StartFetch
"""What ``step`` returns: control frames to send (in order) and actions for the glue."""


class _Failure(Exception):
    def __init__(self, code: int, message: str, node: int = -1) -> None:
        super().__init__(message)
        self.code, self.node = code, node


ENGINE_WORK = (m.ExecuteGraph, m.RegisterGraph)
"""Messages whose processing may take long: a session runs them in a worker thread."""

INLINE_BUDGET = 0.001
"""Seconds of engine work a batch may do on the network loop instead of a worker thread,
judged from each plan's last run. Handing a small step to a thread and back costs more
than the step (two wakeups and a GIL ping-pong: a digits-MLP step took ~1000 us of server
CPU through a thread, ~520 us inline); a plan not yet timed, or slower, always goes to a
worker, so the loop never stalls other sessions for longer than this."""

MAX_REFUSED_GRAPHS = 64
"""Refused digests a session remembers (a client retrying more is refused again)."""


class Session:
    """Tensor store and message interpreter of one client connection."""

    def __init__(self, state: ServerState, peer_id: str = "") -> None:
        self.state = state
        self.peer_id = peer_id
        self.id = 0
        self.store: dict[int, Any] = {}
        self.nbytes = 0
        self.peak = 0
        self.refused: dict[str, tuple[int, str, int]] = {}
        """Digests this session registered and the server refused: executing one fails with the
        reason (error code, message, node) instead of asking the client to re-register."""
        self.graphs: set[str] = set()
        self.plan_seconds: dict[bytes, float] = {}
        """Digest -> seconds its last execution took (see ``needs_worker``)."""
        self.stalled = False
        self.closed = False
        """Set when the connection must end (bad version, session limit)."""
        self.greeted = False
        self.queue: deque[m.Message] = deque()
        self.bulk_in: dict[int, bytes | None] = {}
        self.fetched: dict[int, Any] = {}
        self.waiting: tuple[str, int] | None = None
        """("bulk", bulk_id) or ("fetch", tensor_id) while ``step`` cannot go on."""
        self._replies: list[m.Message] = []
        self._out: list[Output] = []
        self._bulk_ids = 0

    # --- inputs -----------------------------------------------------------------------------
    def feed_control(self, frame: bytes) -> None:
        """Queue a control frame's messages; a malformed frame is answered and skipped."""
        try:
            msgs = m.decode(frame)
        except m.DecodeError as exc:
            self._replies.append(m.Error(m.MALFORMED, str(exc), -1, 0))
            return
        self.queue.extend(msgs)

    def feed_bulk(self, bulk_id: int, payload: bytes | None) -> None:
        """A bulk stream's bytes (None: the glue gave up waiting for them)."""
        self.bulk_in[bulk_id] = payload

    def feed_fetched(self, tensor_id: int, result: Any) -> None:
        """``result``: (dtype, shape, bytes) from the source server, or an error string."""
        self.fetched[tensor_id] = result

    # --- processing -------------------------------------------------------------------------
    def needs_worker(self) -> bool:
        """Whether what is queued includes engine work too long for the network loop: a
        graph to compile, a plan not yet timed, or more than INLINE_BUDGET of timed plans.
        Reads, syncs and drops are answered on the loop, saving a thread handoff on every
        `item()` round trip."""
        budget = INLINE_BUDGET
        for msg in self.queue:
            if isinstance(msg, ENGINE_WORK):
                cost = self.plan_seconds.get(msg.digest) if type(msg) is m.ExecuteGraph else None
                if cost is None or cost > budget:
                    return True
                budget -= cost
        return False

    def step(self) -> list[Output]:
        """Run queued messages until done or blocked on a bulk payload or a fetch."""
        while self.queue and not self.closed:
            msg = self.queue[0]
            if self.waiting is not None and not self._ready(self.waiting):
                break
            self.queue.popleft()
            try:
                self._dispatch(msg)
            except _Failure as f:
                self._replies.append(m.Error(f.code, str(f), f.node, _request_id(msg)))
            except LimitExceeded as exc:
                self._replies.append(m.Error(m.LIMIT, str(exc), -1, _request_id(msg)))
            except Exception as exc:  # a bug must not end the server or the session
                log.exception("internal error on %s", type(msg).__name__)
                self._replies.append(
                    m.Error(m.INTERNAL, f"{type(exc).__name__}: {exc}", -1, _request_id(msg))
                )
            if self.waiting is not None and self.queue and self.queue[0] is msg:
                break
        return self._flush()

    def _ready(self, waiting: tuple[str, int]) -> bool:
        kind, key = waiting
        return key in (self.bulk_in if kind == "bulk" else self.fetched)

    def _flush(self) -> list[Output]:
        out = self._out
        if self._replies:
            out.insert(0, m.encode(self._replies))
        self._replies, self._out = [], []
        return out

    def _dispatch(self, msg: m.Message) -> None:
        if not self.greeted:
            self._hello(msg)
            return
        if self.stalled and not isinstance(msg, m.Resync | m.Upload):
            rid = _request_id(msg)
            if rid and not isinstance(msg, m.ExecuteGraph):
                raise _Failure(m.STALLED, "session stalled after UNKNOWN_GRAPH; send Resync")
            return
        handler = _HANDLERS.get(type(msg))
        if handler is None:
            raise _Failure(m.MALFORMED, f"{type(msg).__name__} is not a client request")
        handler(self, msg)

    def _hello(self, msg: m.Message) -> None:
        if not isinstance(msg, m.Hello):
            raise _Failure(m.MALFORMED, f"expected Hello first, got {type(msg).__name__}")
        if msg.version != m.PROTOCOL_VERSION:
            self.closed = True
            raise _Failure(m.VERSION, f"protocol version {msg.version} is not {m.PROTOCOL_VERSION}")
        try:
            self.id = self.state.open_session(self)
        except LimitExceeded:
            self.closed = True
            raise
        self.greeted = True
        self._replies.append(
            m.Welcome(
                m.PROTOCOL_VERSION,
                self.id,
                self.id.to_bytes(8, "big"),
                self.state.peer_id,
                self.state.limits.as_welcome(),
                dict(self.state.extensions),
            )
        )

    # --- tensor store -----------------------------------------------------------------------
    def _put(self, tensor_id: int, array: Any) -> None:
        self._put_many(((tensor_id, array),))

    def _put_many(self, items: Iterable[tuple[int, Any]]) -> None:
        """Store tensors (replacing any with the same id), charging the quotas once: all are
        stored or, past a limit, none."""
        new_items = dict(items)
        store = self.store
        added = delta = 0
        for tid, array in new_items.items():
            old = store.get(tid)
            delta += _nbytes(array) - _nbytes(old)
            added += old is None
        limit = self.state.limits.max_tensors
        if added and len(store) + added > limit:
            raise LimitExceeded(
                f"session holds {len(store)} tensors and {added} more would exceed "
                f"max_tensors {limit}"
            )
        self.state.account(added, delta, self.nbytes)
        store.update(new_items)
        self.nbytes += delta
        self.peak = max(self.peak, self.nbytes)

    def _drop(self, ids: Iterable[int]) -> None:
        count = freed = 0
        for i in ids:
            a = self.store.pop(i, None)
            if a is not None:
                count += 1
                freed += _nbytes(a)
        if count:
            self.nbytes -= freed
            self.state.account(-count, -freed, self.nbytes)

    def _get(self, tensor_id: int) -> Any:
        try:
            return self.store[tensor_id]
        except KeyError:
            raise _Failure(
                m.MISSING_TENSOR, f"tensor {tensor_id} does not exist in this session"
            ) from None

    def close(self) -> None:
        """Free everything this session holds (the client went away)."""
        self._drop(tuple(self.store))
        self.bulk_in.clear()
        self.state.close_session(self.id)

    # --- handlers ---------------------------------------------------------------------------
    def _upload(self, msg: m.Upload) -> None:
        data = msg.data
        if msg.bulk_id:
            if msg.bulk_id not in self.bulk_in:
                self.waiting = ("bulk", msg.bulk_id)
                self.queue.appendleft(msg)
                return
            self.waiting = None
            data = self.bulk_in.pop(msg.bulk_id)
            if data is None:
                raise _Failure(m.MALFORMED, f"bulk {msg.bulk_id} of an Upload never arrived")
        self._put(msg.tensor_id, self._array(msg.dtype, msg.shape, data))

    def _array(self, dtype: str, shape: tuple[int, ...], data: bytes) -> Any:
        try:
            dt = dtypes.to_numpy(dtype)
        except TypeError as exc:
            raise _Failure(m.MALFORMED, str(exc)) from None
        count = int(np.prod(shape, dtype=np.uint64)) if shape else 1
        if count * dt.itemsize != len(data):
            raise _Failure(
                m.MALFORMED,
                f"{dtype}{list(shape)} needs {count * dt.itemsize} bytes, got {len(data)}",
            )
        host = np.frombuffer(data, dtype=dt).reshape(shape).copy()
        return self.state.backend.from_numpy(host)

    def _register(self, msg: m.RegisterGraph) -> None:
        digest = msg.digest.hex()
        limit = self.state.limits.max_graphs
        if digest not in self.graphs and len(self.graphs) >= limit:
            self._refuse(digest, m.LIMIT, f"session registered {len(self.graphs)} graphs "
                         f"(max_graphs {limit})")  # fmt: skip
        try:
            self.state.register(digest, msg.graph)
        except GraphError as exc:
            self._refuse(digest, m.BAD_GRAPH, f"graph refused: {exc}", exc.node)
        self.refused.pop(digest, None)
        self.graphs.add(digest)

    def _refuse(self, digest: str, code: int, message: str, node: int | None = None) -> None:
        """Fail this registration and every execution of ``digest`` until it registers: the
        client would otherwise take the missing plan for an eviction and re-register forever."""
        if len(self.refused) >= MAX_REFUSED_GRAPHS:
            self.refused.clear()
        self.refused[digest] = (code, message, -1 if node is None else node)
        raise _Failure(*self.refused[digest])

    def _execute(self, msg: m.ExecuteGraph) -> None:
        refused = self.refused.get(msg.digest.hex())
        if refused is not None:  # not evicted but refused: re-registering would not help
            self._drop(msg.drops)
            raise _Failure(*refused)
        plan = self.state.plan(msg.digest.hex())
        if plan is None:  # the client resends this message (drops included) after Resync
            self.stalled = True
            raise _Failure(m.UNKNOWN_GRAPH, f"unknown graph {msg.digest.hex()}")
        try:
            self._run(plan, msg)
        finally:
            self._drop(msg.drops)

    def _run(self, plan: Any, msg: m.ExecuteGraph) -> None:
        graph = plan.graph
        if (
            len(msg.input_ids) != plan.n_inputs
            or len(msg.values) != len(plan.value_slots)
            or len(msg.output_ids) != len(plan.outputs)
        ):
            raise _Failure(
                m.MALFORMED,
                f"graph takes {plan.n_inputs} inputs, {len(plan.value_slots)} values and "
                f"{len(plan.outputs)} outputs; got {len(msg.input_ids)}, {len(msg.values)} "
                f"and {len(msg.output_ids)}",
            )
        inputs = []
        for k, (tid, (shape, dt)) in enumerate(zip(msg.input_ids, graph.inputs)):
            a = self._get(tid)
            if tuple(a.shape) != shape or a.dtype != dtypes.to_numpy(dt):
                raise _Failure(
                    m.MISSING_TENSOR,
                    f"input {k} (tensor {tid}) is {a.dtype}{list(a.shape)}, the graph wants "
                    f"{dt}{list(shape)}",
                )
            inputs.append(a)
        # Inputs the client drops with this very message (an optimizer's old weights) are
        # donated: they leave the store now and the graph frees them at their last use.
        dropping = set(msg.drops)
        donated = [k for k, tid in enumerate(msg.input_ids) if tid in dropping]
        self._drop(tuple(msg.input_ids[k] for k in donated))
        start = time.perf_counter()
        try:
            outs = self.state.executor.run(plan, inputs, msg.values, donated)
        except ExecutionError as exc:
            raise _Failure(m.EXECUTION, str(exc), exc.node) from None
        except (TypeError, ValueError, OverflowError) as exc:
            raise _Failure(m.MALFORMED, f"bad bindings: {exc}") from None
        if len(self.plan_seconds) >= self.state.limits.max_graphs:
            self.plan_seconds.clear()
        self.plan_seconds[msg.digest] = time.perf_counter() - start
        try:
            self._put_many(zip(msg.output_ids, outs))
        except LimitExceeded:
            self._drop(msg.output_ids)  # no stale tensor under an id the client now expects
            raise

    def _read(self, msg: m.Read) -> None:
        host = np.ascontiguousarray(self.state.backend.to_numpy(self._get(msg.tensor_id)))
        payload = host.tobytes()
        name = dtypes.from_numpy(host.dtype)
        if len(payload) > m.BULK_THRESHOLD:
            self._bulk_ids += 1
            self._replies.append(m.Data(msg.request_id, name, host.shape, b"", self._bulk_ids))
            self._out.append(SendBulk(self._bulk_ids, payload))
        else:
            self._replies.append(m.Data(msg.request_id, name, host.shape, payload, 0))

    def _sync(self, msg: m.Sync) -> None:
        self._replies.append(m.Ack(msg.request_id))

    def _memory(self, msg: m.MemoryStats) -> None:
        st = self.state
        self._replies.append(
            m.MemoryStats(
                msg.request_id,
                len(self.store),
                self.nbytes,
                st.tensors,
                st.bytes,
                len(st.sessions),
                self.peak,
                st.peak_bytes,
            )
        )

    def _resync(self, msg: m.Resync) -> None:
        self.stalled = False

    def _expose(self, msg: m.Expose) -> None:
        token = self.state.grant(msg.peer_id, self._get(msg.tensor_id))
        self._replies.append(m.Token(msg.request_id, token))

    def _fetch(self, msg: m.Fetch) -> None:
        tid = msg.tensor_id
        if tid not in self.fetched:
            if self.waiting != ("fetch", tid):
                self.waiting = ("fetch", tid)
                self._out.append(StartFetch(tid, msg.source_peer, msg.source_address, msg.token))
            self.queue.appendleft(msg)
            return
        self.waiting = None
        result = self.fetched.pop(tid)
        if isinstance(result, str):
            raise _Failure(m.CAPABILITY, f"fetch from {msg.source_peer[:12]}... failed: {result}")
        dtype, shape, data = result
        self._put(tid, self._array(dtype, shape, data))


def _nbytes(array: Any) -> int:
    return 0 if array is None else int(getattr(array, "nbytes", 0))


def _request_id(msg: m.Message) -> int:
    return getattr(msg, "request_id", 0)


_HANDLERS: dict[type, Any] = {
    m.Upload: Session._upload,
    m.RegisterGraph: Session._register,
    m.ExecuteGraph: Session._execute,
    m.Read: Session._read,
    m.Drop: lambda s, msg: s._drop(msg.tensor_ids),
    m.Sync: Session._sync,
    m.MemoryStats: Session._memory,
    m.Resync: Session._resync,
    m.Expose: Session._expose,
    m.Fetch: Session._fetch,
}

__all__ = ["Output", "SendBulk", "Session", "StartFetch"]

from .jobs._wire import JOB_HANDLERS  # noqa: E402  (job and artifact messages: server/jobs)

_HANDLERS.update(JOB_HANDLERS)
