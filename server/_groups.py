"""Device groups on a server: set-up messages, ring links to the neighbours, and the ring
all-reduce that runs over them.

A client makes this server rank r of a group (``GroupSetup``): the server admits the two
ring neighbours' peer ids at its TLS layer for group links only (they need not be in its
authorized peers: the client, who is, vouched for them), then on ``GroupStart`` dials its
successor itself (``_peers.dial_peer``: addresses this server resolves, never the client's)
and presents the group's one-time capability; its predecessor does the same towards it.
Each link carries, on its first stream, heartbeats both ways (``GroupBeat``), aborts
(``GroupAbort``) and NCCL's unique id; on its second stream, the dialler's data to its
successor: per all-reduce a ``RingHeader`` and the pieces of the ring schedule
(``engine/collective/ring.py``), sent as soon as they are reduced, so the ring pipelines.

Everything here runs on the server's trio loop. The ``all_reduce`` kernel runs on an engine
worker thread and waits for :meth:`GroupMember.all_reduce_async` through
``trio.from_thread``: the loop keeps moving bytes (and other sessions) while it waits.

Faults: a link that closes, or whose peer is silent for ``LINK_TIMEOUT``, fails the group
naming that rank; the failure is forwarded on the other link so every surviving rank fails
the same way, and any collective under way or to come raises it (``GroupFailure`` -> error
``GROUP``). The server and its other sessions go on; the client closes the group and may
build a new one from the survivors.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any

import numpy as np
import trio

from ..engine.collective import GroupFailure, ring
from ..protocol import dtypes
from ..protocol import messages as m
from ..protocol.transport import Connection, Endpoint, FrameStream, PeerId, TransportError

log = logging.getLogger("burn_remote.server")

LINK_TIMEOUT = m.LINK_TIMEOUT
LINK_BEAT = m.LINK_BEAT
SETUP_TIMEOUT = 30.0
"""Seconds GroupStart waits for both ring links to come up."""
ABORT_GRACE = 1.0
"""Seconds a failed member gives its aborts to leave before it closes its links."""
MAX_SESSION_GROUPS = 16
"""Groups one session may have open at once."""
ENGINES = ("ring", "nccl")


class GroupMember:
    """This server's rank of one group (owned by one client session)."""

    def __init__(self, service: GroupService, msg: m.GroupSetup, session: Any) -> None:
        self.service = service
        self.id, self.rank, self.peers = msg.group_id, msg.rank, msg.peers
        self.size = len(msg.peers)
        self.capability = msg.capability
        self.timeout = max(msg.timeout_ms, 1) / 1000
        self.session_id = session.id
        self.owner = session.peer_id
        self.engine = "ring"
        self.failure: GroupFailure | None = None
        self.closed = False
        self.pred = (self.rank - 1) % self.size
        self.succ = (self.rank + 1) % self.size
        self.started = trio.Event()
        self.linked = trio.Event()
        """Both links up (or failed: check ``failure``)."""
        self.ended = trio.Event()
        self.succ_ctl: FrameStream | None = None
        self.pred_ctl: FrameStream | None = None
        self.data_out: FrameStream | None = None
        self.data_in: FrameStream | None = None
        self.conns: list[Connection] = []
        self.nccl: Any = None
        self._nccl_id = trio.Event()
        self._nccl_bytes = b""
        self._seq = 0
        self._op_scope: trio.CancelScope | None = None
        self._scope = trio.CancelScope()
        self._nursery: trio.Nursery | None = None
        self._progress = trio.lowlevel.ParkingLot()
        self._received = 0
        self._moved = {"succ": 0.0, "pred": 0.0}
        """When a piece last left (to the successor) or arrived (from the predecessor): a
        link busy with ring data is alive even if its heartbeats queue behind the data."""
        self._heard = {"succ": 0.0, "pred": 0.0}
        """When each link last delivered a frame (heartbeat, abort or data): which side went
        quiet, when a neighbour's abort blames this rank."""

    def name(self, rank: int) -> str:
        return self.peers[rank] if 0 <= rank < self.size else ""

    # --- life -------------------------------------------------------------------------------
    async def run(self) -> None:
        """The member's tasks (links, heartbeats), until closed."""
        with self._scope:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await self.started.wait()
                if self.size == 1:
                    self.linked.set()
                else:
                    nursery.start_soon(self._dial_successor)
                    with trio.move_on_after(SETUP_TIMEOUT):
                        while not (self.succ_ctl and self.pred_ctl) and self.failure is None:
                            await self._progress.park()
                    if self.failure is None and not (self.succ_ctl and self.pred_ctl):
                        late = self.succ if self.succ_ctl is None else self.pred
                        self.fail(late, f"no ring link within {SETUP_TIMEOUT:g} s")
                    if self.failure is None and self.engine == "nccl":
                        await self._start_nccl()
                    self.linked.set()
                await trio.sleep_forever()
        self.ended.set()
        for conn in self.conns:
            with trio.move_on_after(ABORT_GRACE):
                await conn.close("group closed", flush_timeout=ABORT_GRACE)

    def close(self) -> None:
        """Leave the group (loop thread): ranks waiting here fail, links close."""
        if not self.closed:
            self.closed = True
            if self.failure is None:
                self.failure = GroupFailure(self.id, -1, "", "the group was closed")
            if self._op_scope is not None:
                self._op_scope.cancel()
            self._scope.cancel()
            self.linked.set()
            self._progress.unpark_all()

    def fail(self, rank: int, reason: str, via: FrameStream | None = None) -> None:
        """The group cannot go on because of ``rank``: remember why (first failure wins),
        stop what runs, tell the neighbours (not back over ``via``), close the links."""
        if self.failure is not None:
            return
        self.failure = GroupFailure(self.id, rank, self.name(rank), reason)
        log.warning(
            "group %016x failed: %s",
            self.id,
            self.failure,
            extra={"event": "group_failed", "session": self.session_id},
        )
        if self._op_scope is not None:
            self._op_scope.cancel()
        if self.nccl is not None:
            self.nccl.abort()
        self.linked.set()
        self._progress.unpark_all()
        if self._nursery is not None:
            abort = m.encode(m.GroupAbort(self.id, rank, reason))
            for ctl in (self.succ_ctl, self.pred_ctl):
                if ctl is not None and ctl is not via:
                    self._nursery.start_soon(_send_quietly, ctl, abort)
            self._nursery.start_soon(self._close_after_grace)

    async def _close_after_grace(self) -> None:
        await trio.sleep(ABORT_GRACE)
        self._scope.cancel()

    # --- links ------------------------------------------------------------------------------
    async def _dial_successor(self) -> None:
        from ._peers import dial_peer

        svc = self.service
        try:
            conn = await dial_peer(svc.ep, svc.state, self.peers[self.succ], requester=self.owner)
            self.conns.append(conn)
            ctl = await conn.open_stream()
            await ctl.send_frame(m.encode(m.GroupLink(self.id, self.rank, self.capability)))
            with trio.fail_after(SETUP_TIMEOUT):
                (reply,) = m.decode(await ctl.receive_frame() or b"")
            if isinstance(reply, m.Error):
                raise TransportError(f"refused the link: {reply.message}")
            if not isinstance(reply, m.GroupLink) or reply.rank != self.succ:
                raise TransportError(f"answered the link with {type(reply).__name__}")
            self.data_out = await conn.open_stream()
        except (TransportError, OSError, ValueError, m.DecodeError, trio.TooSlowError) as exc:
            self.fail(self.succ, f"cannot link to it: {type(exc).__name__}: {exc}")
            return
        except Exception as exc:  # LimitExceeded (dial rate) and the like
            self.fail(self.succ, f"cannot link to it: {exc}")
            return
        self.succ_ctl = ctl
        self._progress.unpark_all()
        await self._tend(ctl, self.succ, "succ")

    async def attach_predecessor(self, conn: Connection, ctl: FrameStream) -> None:
        """The predecessor's link arrived (its connection's handler calls this and stays
        here until the member ends: the connection lives as long as the handler)."""
        self.conns.append(conn)
        self.pred_ctl = ctl
        self._progress.unpark_all()
        if self._nursery is None:  # never: run() starts at GroupSetup, before any link
            return
        self._nursery.start_soon(self._tend, ctl, self.pred, "pred")
        await self.ended.wait()

    async def _tend(self, ctl: FrameStream, rank: int, side: str) -> None:
        """Heartbeats out, heartbeats and aborts in, and the watchdog, for one link."""
        seen = [trio.current_time()]
        self._heard[side] = seen[0]

        async def beat() -> None:
            frame = m.encode(m.GroupBeat(self.id))
            while True:
                await ctl.send_frame(frame)
                await trio.sleep(LINK_BEAT)

        async def watch() -> None:
            while True:
                await trio.sleep(LINK_BEAT)
                now = trio.current_time()
                if now - max(seen[0], self._moved[side]) > LINK_TIMEOUT:
                    self.fail(rank, f"silent for {LINK_TIMEOUT:g} s: dead or cut off")
                    return

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(beat)
                nursery.start_soon(watch)
                while self.failure is None:
                    frame = await ctl.receive_frame()
                    if frame is None:
                        self.fail(rank, "closed its link")
                        break
                    for msg in m.decode(frame):
                        seen[0] = self._heard[side] = trio.current_time()
                        if isinstance(msg, m.GroupAbort):
                            self.fail(self._blamed(msg.rank), msg.reason, via=ctl)
                        elif isinstance(msg, m.NcclId):
                            self._nccl_bytes = msg.unique_id
                            self._nccl_id.set()
                nursery.cancel_scope.cancel()
        except (TransportError, m.DecodeError) as exc:
            self.fail(rank, f"link lost: {exc}")

    def _blamed(self, rank: int) -> int:
        """The culprit to name for an abort that names ``rank``. A neighbour that stopped
        hearing this rank blames it, though from here the fault is the link to that
        neighbour (both servers are up): name the neighbour whose link went quiet first, as
        this rank's own watchdog would a moment later."""
        if rank != self.rank:
            return rank
        quiet = min(self._heard, key=lambda side: max(self._heard[side], self._moved[side]))
        return self.succ if quiet == "succ" else self.pred

    # --- the ring all-reduce ------------------------------------------------------------------
    async def all_reduce_async(self, host: np.ndarray, op: str) -> np.ndarray:
        """This rank's part of the k-th all-reduce of the group (loop thread): a new array;
        ``host`` (C-contiguous) is only read."""
        seq, self._seq = self._seq, self._seq + 1
        if not self.linked.is_set() and self.failure is None:
            with trio.move_on_after(SETUP_TIMEOUT):
                await self.linked.wait()
        if self.failure is not None:
            raise self.failure
        if not self.linked.is_set():
            raise GroupFailure(self.id, -1, "", "the group was never started (GroupStart)")
        x = host.reshape(-1)
        acc = np.empty_like(x) if self.size > 1 else x.copy()  # ring.apply fills it
        self._received = 0  # pieces of this all-reduce received (the sender waits on it)
        if self.size > 1:
            with trio.CancelScope() as cs:
                self._op_scope = cs
                cs.deadline = trio.current_time() + 2 * self.timeout
                try:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._send_all, x, acc, seq, op)
                        nursery.start_soon(self._receive_all, x, acc, seq, op)
                except (TransportError, m.DecodeError) as exc:
                    self.fail(self.pred, f"link lost during all_reduce #{seq}: {exc}")
                finally:
                    self._op_scope = None
            if cs.cancelled_caught and self.failure is None:
                self.fail(-1, f"all_reduce #{seq} did not complete within {2 * self.timeout:g} s")
            if self.failure is not None:
                raise self.failure
        return ring.finish(acc, op, self.size).reshape(host.shape)

    def _plan(self, acc: np.ndarray) -> ring.Plan:
        return ring.Plan(self.rank, self.size, acc.size, acc.itemsize)

    async def _send_all(self, x: np.ndarray, acc: np.ndarray, seq: int, op: str) -> None:
        assert self.data_out is not None
        out = self.data_out
        name = dtypes.from_numpy(acc.dtype)
        await out.send_frame(m.encode(m.RingHeader(seq, name, acc.size, op)))
        plan = self._plan(acc)
        where = {(k, a): j for j, (k, a, _, _) in enumerate(plan.receives())}
        item = acc.itemsize
        for k, a, b in plan.sends():
            if k:  # the piece received (and reduced) at the previous step goes on
                need = where[(k - 1, a)] + 1
                while self._received < need:
                    await self._progress.park()
            raw = ring.source(k, x, acc).view(np.uint8)
            await out.send_frame(raw[a * item : b * item].data)
            self._moved["succ"] = trio.current_time()

    async def _receive_all(self, x: np.ndarray, acc: np.ndarray, seq: int, op: str) -> None:
        if self.data_in is None:
            assert self.pred_conn is not None
            with trio.move_on_after(self.timeout):
                self.data_in = await self.pred_conn.accept_stream()
            if self.data_in is None:
                self.fail(self.pred, f"did not reach all_reduce #{seq} within {self.timeout:g} s")
                return
        data_in = self.data_in
        with trio.move_on_after(self.timeout) as wait:
            frame = await data_in.receive_frame()
        if wait.cancelled_caught:
            self.fail(self.pred, f"did not reach all_reduce #{seq} within {self.timeout:g} s")
            return
        (head,) = m.decode(frame or b"")
        mine = m.RingHeader(seq, dtypes.from_numpy(acc.dtype), acc.size, op)
        if head != mine:
            self.fail(
                self.pred,
                f"sent all_reduce #{getattr(head, 'seq', '?')} of "
                f"{getattr(head, 'dtype', '?')}[{getattr(head, 'count', '?')}] "
                f"op={getattr(head, 'op', '?')}; rank {self.rank} has #{seq} of "
                f"{mine.dtype}[{mine.count}] op={op}",
            )
            return
        for _, a, b, reduce in self._plan(acc).receives():
            frame = await data_in.receive_frame()
            if frame is None or len(frame) != (b - a) * acc.itemsize:
                self.fail(self.pred, f"sent a malformed piece of all_reduce #{seq}")
                return
            ring.apply(acc, a, b, np.frombuffer(frame, acc.dtype), reduce, x)
            self._moved["pred"] = trio.current_time()
            self._received += 1
            self._progress.unpark_all()

    @property
    def pred_conn(self) -> Connection | None:
        return self.pred_ctl._conn if self.pred_ctl is not None else None  # noqa: SLF001

    # --- NCCL ---------------------------------------------------------------------------------
    async def _start_nccl(self) -> None:
        """Rank 0 makes NCCL's unique id and sends it around the ring over the links (the
        authenticated channel); every rank then joins the communicator (a blocking call, on
        a thread)."""
        from ..engine.collective import nccl

        assert self.succ_ctl is not None
        if self.rank == 0:
            uid = await trio.to_thread.run_sync(nccl.unique_id)
        else:
            with trio.move_on_after(SETUP_TIMEOUT):
                await self._nccl_id.wait()
            if not self._nccl_id.is_set():
                self.fail(self.pred, "sent no NCCL id")
                return
            uid = self._nccl_bytes
        if self.succ != 0:
            await self.succ_ctl.send_frame(m.encode(m.NcclId(self.id, uid)))
        device = self.service.state.backend
        try:
            self.nccl = await trio.to_thread.run_sync(
                nccl.Communicator, self.size, self.rank, uid, device
            )
        except Exception as exc:
            self.fail(-1, f"NCCL communicator failed: {exc}")


async def _send_quietly(ctl: FrameStream, frame: bytes) -> None:
    with trio.move_on_after(ABORT_GRACE):
        try:
            await ctl.send_frame(frame)
        except TransportError:
            pass


class MemberHandle:
    """What a session's scope maps a group id to: the kernel's way into the loop."""

    def __init__(self, member: GroupMember, token: trio.lowlevel.TrioToken) -> None:
        self.member, self.token = member, token

    def all_reduce(self, x: Any, op: str, backend: Any) -> Any:
        member = self.member
        if member.engine == "nccl" and member.nccl is not None:
            return member.nccl.all_reduce(x, op, backend, member)
        host = np.ascontiguousarray(backend.to_numpy(x))  # no copy on the CPU backend
        out = trio.from_thread.run(member.all_reduce_async, host, op, trio_token=self.token)
        return backend.from_numpy(out)


class GroupService:
    """The groups of one server: created by ``serve`` with its endpoint and a nursery."""

    def __init__(self, state: Any, ep: Endpoint, nursery: trio.Nursery) -> None:
        self.state, self.ep, self.nursery = state, ep, nursery
        self.token = trio.lowlevel.current_trio_token()
        self.members: dict[int, GroupMember] = {}

    # --- client messages (loop thread, except start) ------------------------------------------
    def setup(self, session: Any, msg: m.GroupSetup) -> None:
        """Raises GroupFailure/ValueError with what is wrong."""
        me = self.state.peer_id
        size = len(msg.peers)
        if not msg.group_id:
            raise ValueError("group_id must not be 0")
        if msg.rank >= size:
            raise ValueError(f"rank {msg.rank} is not below the group's size {size}")
        try:
            peers = [str(PeerId.parse(p)) for p in msg.peers]
        except ValueError as exc:
            raise ValueError(f"peers: {exc}") from None
        if len(set(peers)) != size:
            raise ValueError("a peer is listed twice (one rank per server)")
        if peers[msg.rank] != me:
            raise ValueError(f"peers[{msg.rank}] is {peers[msg.rank][:12]}..., not this server")
        if len(msg.capability) != 32:
            raise ValueError("capability must be 32 bytes")
        if msg.group_id in self.members:
            raise ValueError(f"group {msg.group_id:016x} is already set up on this server")
        if len(session.groups) >= MAX_SESSION_GROUPS:
            raise ValueError(f"session has {len(session.groups)} groups (MAX_SESSION_GROUPS)")
        member = GroupMember(self, msg, session)
        member.peers = tuple(peers)
        self.members[msg.group_id] = member
        session.groups[msg.group_id] = MemberHandle(member, self.token)
        policy = self.state.authorized
        if policy is not None and size > 1:
            for r in {member.pred, member.succ}:
                policy.admit_guest(PeerId.parse(peers[r]))
        self._spawn(self._run, member)

    def _spawn(self, fn: Any, *args: Any) -> None:
        """Start a task on the loop from the loop or from an engine worker: a session's
        messages run on a worker thread while a server-to-server move is under way (a
        replica's model arriving just before its group is set up)."""
        try:
            trio.lowlevel.current_task()
        except RuntimeError:  # not on the loop's thread
            trio.from_thread.run_sync(self.nursery.start_soon, fn, *args, trio_token=self.token)
            return
        self.nursery.start_soon(fn, *args)

    async def _run(self, member: GroupMember) -> None:
        try:
            await member.run()
        finally:
            if self.members.get(member.id) is member:
                del self.members[member.id]
            policy = self.state.authorized
            if policy is not None and member.size > 1:
                for r in {member.pred, member.succ}:
                    policy.release_guest(PeerId.parse(member.peers[r]))

    async def start(self, member: GroupMember, engine: str) -> None:
        """GroupStart: dial the successor, wait for both links (raises GroupFailure)."""
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        member.engine = engine
        member.started.set()
        await member.linked.wait()
        if member.failure is not None:
            raise member.failure

    def close(self, session: Any, group_id: int) -> None:
        handle = session.groups.pop(group_id, None)
        if handle is not None:
            handle.member.close()

    def close_session(self, session: Any) -> None:
        """A session ended: its groups end with it (thread-safe)."""
        groups = list(session.groups)

        def close_all() -> None:
            for gid in groups:
                self.close(session, gid)

        self.token.run_sync_soon(close_all)

    # --- server-to-server ---------------------------------------------------------------------
    async def serve_link(self, conn: Connection, ctl: FrameStream, first: bytes) -> None:
        """A predecessor's link (the first frame of a connection is a GroupLink)."""
        (msg,) = m.decode(first)
        member = self.members.get(msg.group_id)
        peer = str(conn.peer_id)
        why = None
        if member is None or member.closed:
            why = "no such group on this server"
        elif not hmac.compare_digest(msg.capability, member.capability):
            why = "wrong group capability"
        elif msg.rank != member.pred or member.peers[msg.rank] != peer:
            why = f"peer {peer[:12]}... is not rank {member.pred} of this group"
        elif member.pred_ctl is not None:
            why = "this group's link is already up"
        if why is not None:
            log.warning("group link refused: %s", why, extra={"event": "group_link_refused"})
            await ctl.send_frame(m.encode(m.Error(m.CAPABILITY, why, -1, 0)))
            await conn.close(why)
            return
        assert member is not None
        await ctl.send_frame(m.encode(m.GroupLink(member.id, member.rank, b"")))
        await member.attach_predecessor(conn, ctl)


def is_group_link(frame: bytes) -> bool:
    try:
        msgs = m.decode(frame)
    except m.DecodeError:
        return False
    return len(msgs) == 1 and isinstance(msgs[0], m.GroupLink)


__all__ = ["LINK_TIMEOUT", "GroupMember", "GroupService", "is_group_link"]
