"""The server's one handler table: every client message -> the function that answers it and
where it runs (see :class:`~._replies.Place`).

A new client message is one entry here; ``tests/remote/test_handlers.py`` checks that every
client message has exactly one and that no handler placed on the loop waits. Session
handlers are below; the job and artifact handlers live in ``jobs/_wire.py``.
"""

from __future__ import annotations

import json
import operator
from typing import TYPE_CHECKING, Any

from ..engine.collective import GroupFailure, scope
from ..engine.executor import ExecutionError, Plan, input_check
from ..protocol import dtypes
from ..protocol import messages as m
from ..protocol.bulk import byte_view
from ..protocol.graph import GraphError
from ..protocol.transport import PeerId
from ._replies import Failure, Handler, Place, Reply, SendBulk, StartFetch, Wait
from ._state import LimitExceeded, host_array
from .jobs._wire import JOB_HANDLERS

if TYPE_CHECKING:
    from ._session import Session

MAX_REFUSED_GRAPHS = 64
"""Refused digests a session remembers (a client retrying more is refused again)."""

_shape = operator.attrgetter("shape")
_dtype = operator.attrgetter("dtype")


def upload(s: Session, msg: m.Upload, now: float) -> Reply:
    data = msg.data
    if msg.bulk_id:
        if msg.bulk_id not in s.bulk_in:
            return Wait("bulk", msg.bulk_id)
        data = s.take_bulk(msg.bulk_id)
    s.put(msg.tensor_id, s.array(msg.dtype, msg.shape, data))
    s.traffic[1] += int(getattr(data, "nbytes", None) or len(data))
    return None


def register(s: Session, msg: m.RegisterGraph, now: float) -> Reply:
    digest = msg.digest.hex()
    limit = s.state.limits.max_graphs
    if digest not in s.graphs and len(s.graphs) >= limit:
        _refuse(
            s, digest, m.LIMIT, f"session registered {len(s.graphs)} graphs (max_graphs {limit})"
        )
    try:
        s.state.register(digest, msg.graph, s.id, s.nbytes + s.bulk_reserved)
    except GraphError as exc:
        _refuse(s, digest, m.BAD_GRAPH, f"graph refused: {exc}", exc.node)
    except LimitExceeded as exc:
        _refuse(s, digest, m.LIMIT, f"graph refused: {exc}")
    s.refused.pop(digest, None)
    s.graphs.add(digest)
    return None


def _refuse(s: Session, digest: str, code: int, message: str, node: int | None = None) -> None:
    """Fail this registration and every execution of ``digest`` until it registers: the
    client would otherwise take the missing plan for an eviction and re-register forever."""
    if len(s.refused) >= MAX_REFUSED_GRAPHS:
        s.refused.clear()
    s.refused[digest] = (code, message, -1 if node is None else node)
    raise Failure(*s.refused[digest])


def execute(s: Session, msg: m.ExecuteGraph, now: float) -> Reply:
    refused = s.refused.get(msg.digest.hex()) if s.refused else None
    if refused is not None:  # not evicted but refused: re-registering would not help
        s.drop(msg.drops)
        raise Failure(*refused)
    planned, s.planned = s.planned, None
    plan = planned[1] if planned is not None and planned[0] is msg else _plan_of(s, msg)
    if plan is None:  # the client resends this message (drops included) after Resync
        s.stalled = True
        raise Failure(m.UNKNOWN_GRAPH, f"unknown graph {msg.digest.hex()}")
    try:
        _run(s, plan, msg)
    finally:
        if msg.drops:
            s.drop(msg.drops)
    s.traffic[0] += 1
    return None


def _plan_of(s: Session, msg: m.ExecuteGraph) -> Plan | None:
    """The cached plan an ExecuteGraph names (None: unknown or evicted)."""
    return s.state.plan(msg.digest.hex())


def plan_matches(plan: Plan, msg: m.ExecuteGraph) -> bool:
    """Whether an ExecuteGraph binds as many inputs, values and outputs as its plan takes."""
    return (
        len(msg.input_ids) == plan.n_inputs
        and len(msg.values) == len(plan.value_slots)
        and len(msg.output_ids) == len(plan.outputs)
    )


def _run(s: Session, plan: Plan, msg: m.ExecuteGraph) -> None:
    graph = plan.graph
    if not plan_matches(plan, msg):
        raise Failure(
            m.MALFORMED,
            f"graph takes {plan.n_inputs} inputs, {len(plan.value_slots)} values and "
            f"{len(plan.outputs)} outputs; got {len(msg.input_ids)}, {len(msg.values)} "
            f"and {len(msg.output_ids)}",
        )
    ids = msg.input_ids
    try:
        inputs = list(map(s.store.__getitem__, ids))
    except KeyError:
        inputs = [s.get(tid) for tid in ids]  # raises MISSING_TENSOR naming the first
    shapes, np_dtypes = input_check(plan)
    if list(map(_shape, inputs)) != shapes or list(map(_dtype, inputs)) != np_dtypes:
        for k, (tid, a, (shape, dt)) in enumerate(zip(ids, inputs, graph.inputs)):
            if tuple(a.shape) != shape or a.dtype != dtypes.to_numpy(dt):
                raise Failure(
                    m.MALFORMED,
                    f"input {k} (tensor {tid}) is {a.dtype}{list(a.shape)}, the graph wants "
                    f"{dt}{list(shape)}",
                )
    owner_bytes = s.nbytes + s.bulk_reserved
    donated, in_place, dropped = donation(s, msg, inputs)
    if dropped:
        s.drop(dropped)
    if in_place:  # their bytes are the graph's now (as if dropped) until replaced
        written = set(in_place)
        owner_bytes -= sum([int(inputs[k].nbytes) for k in donated if ids[k] in written])
    try:
        outs = _execute(s, plan, msg, inputs, donated, owner_bytes)
    except BaseException:
        if in_place:
            s.drop(in_place)
        s.note_failed(msg.output_ids)
        raise
    try:  # one ledger update: the outputs' charge and the run's arena returned
        s.put_many(zip(msg.output_ids, outs), release=getattr(plan, "peak_bytes", 0))
    except LimitExceeded:
        s.drop(msg.output_ids)  # no stale tensor under an id the client now expects
        raise


def donation(
    s: Session, msg: m.ExecuteGraph, inputs: list[Any]
) -> tuple[list[int], list[int], list[int]]:
    """(input positions donated to the run, ids among them written in place, ids among them
    the message drops without writing them: they leave the store before the run).

    Inputs the client drops with this very message (an optimizer's old weights) are donated:
    they leave the store now and the graph frees them at their last use. Inputs whose id is
    also an output id (state written in place) are donated too but stay in the store until
    the new value replaces them under the same id (no refund and charge again per step); if
    the graph fails they are dropped: gone, never half-updated."""
    ids = msg.input_ids
    written = set(msg.output_ids)
    gone = written.union(msg.drops) if msg.drops else written
    if gone.isdisjoint(ids):
        return [], [], []
    donated = [k for k, tid in enumerate(ids) if tid in gone]
    if s.bulk_out:  # a transfer to the client still reads it: not donated
        donated = [k for k in donated if not s.being_sent(inputs[k])]
    in_place = [ids[k] for k in donated if ids[k] in written]
    dropped = (
        [ids[k] for k in donated if ids[k] not in written] if len(in_place) < len(donated) else []
    )
    return donated, in_place, dropped


def _execute(
    s: Session, plan: Plan, msg: m.ExecuteGraph, inputs: list, donated: list[int], owner_bytes: int
) -> list[Any]:
    """Run the plan; an engine failure becomes the Failure that names the node."""
    try:
        if s.groups or plan.collective:  # the groups its collectives may name
            with scope(s.groups, s.state.backend):
                return s.run_plan(plan, inputs, msg.values, donated, owner_bytes)
        return s.run_plan(plan, inputs, msg.values, donated, owner_bytes)
    except (ExecutionError, TypeError, ValueError, OverflowError) as exc:
        raise engine_failure(exc) from None


def engine_failure(exc: Exception) -> Exception:
    """What the client is told of a run that raised ``exc``: the Failure naming the node
    (a collective's names the group and the culprit rank), MALFORMED for bindings the
    kernels refused; anything else as it is (an internal error)."""
    if isinstance(exc, ExecutionError):
        if isinstance(exc.__cause__, GroupFailure):
            return Failure(m.GROUP, str(exc.__cause__), exc.node)
        return Failure(m.EXECUTION, str(exc), exc.node)
    if isinstance(exc, TypeError | ValueError | OverflowError):
        return Failure(m.MALFORMED, f"bad bindings: {exc}")
    return exc


def read(s: Session, msg: m.Read, now: float) -> Reply:
    """Small values inline; larger ones as a transfer that reads the tensor's memory (no
    copy on the CPU backend; the tensor is not donated to a graph while it is sent)."""
    host = host_array(s.state.backend, s.get(msg.tensor_id))
    name = dtypes.from_numpy(host.dtype)
    limits = s.state.limits
    s.traffic[2] += host.nbytes
    if host.nbytes > limits.bulk_threshold:
        send = s.send_bulk(byte_view(host), limits.bulk_chunk)
        return [m.Data(msg.request_id, name, host.shape, b"", send.bulk_id), SendBulk(send)]
    return [m.Data(msg.request_id, name, host.shape, host.tobytes(), 0)]


def read_alone(s: Session, request_id: int, tensor_id: int) -> bytes | None:
    """``read`` for a control frame that is one Read (``Session.answer_alone``): the reply
    frame, encoded without message objects; None for a missing or large tensor (the frame
    then takes ``read``'s way, which answers the Error or starts the transfer)."""
    a = s.store.get(tensor_id)
    if a is None or int(getattr(a, "nbytes", 0)) > s.state.limits.bulk_threshold:
        return None
    host = host_array(s.state.backend, a)
    s.traffic[2] += host.nbytes
    name = dtypes.from_numpy(host.dtype)
    return m.encode_data_frame(s.packer, request_id, name, host.shape, host.data)


def drop(s: Session, msg: m.Drop, now: float) -> Reply:
    s.drop(msg.tensor_ids)
    return None


def sync(s: Session, msg: m.Sync, now: float) -> Reply:
    return [m.Ack(msg.request_id)]


def memory(s: Session, msg: m.MemoryStats, now: float) -> Reply:
    st = s.state
    room, room_limit = st.room(s)
    return [
        m.MemoryStats(
            msg.request_id,
            len(s.store),
            s.nbytes,
            st.tensors,
            st.bytes,
            len(st.sessions),
            s.peak,
            st.peak_bytes,
            room,
            room_limit,
        )
    ]


def resync(s: Session, msg: m.Resync, now: float) -> Reply:
    s.stalled = False
    return None


def expose(s: Session, msg: m.Expose, now: float) -> Reply:
    try:
        peer = str(PeerId.parse(msg.peer_id))
    except ValueError as exc:
        raise Failure(m.MALFORMED, f"Expose.peer_id: {exc}") from None
    token = s.state.grant(peer, s.get(msg.tensor_id), s.id, s.nbytes + s.bulk_reserved)
    return [m.Token(msg.request_id, token)]


def fetch(s: Session, msg: m.Fetch, now: float) -> Reply:
    """Store a tensor another server exposed. The server finds the source itself
    (``_peers.dial_peer``): an address in the message is refused before anything is dialled,
    so no peer can point the server's handshakes at a host of its choosing."""
    tid = msg.tensor_id
    if tid not in s.fetched:
        if msg.source_address:
            raise Failure(
                m.FORBIDDEN,
                f"Fetch.source_address {msg.source_address[:64]!r} refused: this server dials "
                "only peers whose address it resolves itself (its --peer flags, address book "
                "or relay); send an empty source_address and the source's peer id",
            )
        try:
            PeerId.parse(msg.source_peer)
        except ValueError as exc:
            raise Failure(m.MALFORMED, f"Fetch.source_peer: {exc}") from None
        return Wait("fetch", tid, StartFetch(tid, msg.source_peer, msg.token))
    result = s.fetched.pop(tid)
    if isinstance(result, Failure):
        raise result
    if isinstance(result, str):
        raise Failure(m.CAPABILITY, f"fetch from {msg.source_peer[:12]}... failed: {result}")
    dtype, shape, data = result  # data: a buffer the glue reserved
    s.release(data.nbytes)
    s.put(tid, s.array(dtype, shape, data))
    return None


def group_setup(s: Session, msg: m.GroupSetup, now: float) -> Reply:
    """Become rank ``msg.rank`` of a group (the links come with GroupStart)."""
    svc = _groups_of(s)
    try:
        svc.setup(s, msg)
    except ValueError as exc:
        raise Failure(m.GROUP, f"GroupSetup refused: {exc}") from None
    return [m.GroupReady(msg.request_id, s.state.device)]


def group_start(s: Session, msg: m.GroupStart, now: float) -> Reply:
    """Link to the ring neighbours; waits (on a job worker) until both links are up."""
    import trio

    svc = _groups_of(s)
    handle = s.groups.get(msg.group_id)
    if handle is None:
        raise Failure(m.GROUP, f"group {msg.group_id:016x} is not set up in this session")
    try:
        trio.from_thread.run(svc.start, handle.member, msg.engine, trio_token=svc.token)
    except GroupFailure as exc:
        raise Failure(m.GROUP, str(exc)) from None
    except ValueError as exc:
        raise Failure(m.MALFORMED, f"GroupStart: {exc}") from None
    return [m.Ack(msg.request_id)]


def group_close(s: Session, msg: m.GroupClose, now: float) -> Reply:
    if s.state.collectives is not None:
        s.state.collectives.close(s, msg.group_id)
    return None


def _groups_of(s: Session) -> Any:
    svc = s.state.collectives
    if svc is None:
        raise Failure(m.GROUP, "this server runs no device groups (it serves no network loop)")
    return svc


def _inline_upload(s: Session, msg: m.Upload) -> float | None:
    """A small inline upload is a copy of at most BULK_THRESHOLD bytes."""
    return 0.0 if not msg.bulk_id else None


def _inline_execute(s: Session, msg: m.ExecuteGraph) -> float | None:
    """The plan's last run time (plans are shared, so any session's run counts); the plan
    is kept for ``execute`` (``Session.planned``): one cache lookup per message."""
    plan = _plan_of(s, msg)
    s.planned = (msg, plan)
    return None if plan is None or plan.collective else plan.seconds


def _inline_read(s: Session, msg: m.Read) -> float | None:
    """Reading a small tensor is a copy of at most BULK_THRESHOLD bytes."""
    a = s.store.get(msg.tensor_id)
    small = int(getattr(a, "nbytes", 0)) <= s.state.limits.bulk_threshold
    return 0.0 if a is None or small else None


def status(s: Session, msg: m.ServerStatus, now: float) -> Reply:
    """The operator's view (``burn-remote status``): admins and the server's own key only."""
    if s.peer_id != s.state.peer_id and not s.state.is_admin(s.peer_id):
        raise Failure(
            m.FORBIDDEN,
            "server status is for admins: give this peer role=admin in the server's "
            "authorized_peers file, or ask with the server's own key",
        )
    from ._status import snapshot

    return [m.StatusInfo(msg.request_id, json.dumps(snapshot(s.state, now)).encode())]


HANDLERS: dict[type, Handler] = {
    m.Upload: Handler(upload, Place.ENGINE, _inline_upload),
    m.RegisterGraph: Handler(register, Place.COMPILE),
    m.ExecuteGraph: Handler(execute, Place.ENGINE, _inline_execute),
    m.Read: Handler(read, Place.ENGINE, _inline_read),
    m.Drop: Handler(drop, Place.LOOP),
    m.Sync: Handler(sync, Place.LOOP),
    m.MemoryStats: Handler(memory, Place.LOOP),
    m.Resync: Handler(resync, Place.LOOP),
    m.Expose: Handler(expose, Place.LOOP),
    m.Fetch: Handler(fetch, Place.ENGINE),
    m.ServerStatus: Handler(status, Place.JOBS),  # reads the job store
    m.GroupSetup: Handler(group_setup, Place.LOOP),
    m.GroupStart: Handler(group_start, Place.JOBS),  # waits for the ring links
    m.GroupClose: Handler(group_close, Place.LOOP),
    **JOB_HANDLERS,
}
"""Every client request after Hello (Hello itself opens the session: ``Session._hello``)."""

__all__ = ["HANDLERS", "MAX_REFUSED_GRAPHS"]
