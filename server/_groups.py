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

import functools
import hmac
import logging
import os
import sys
import threading
import time
from typing import Any

import numpy as np
import trio

from ..engine.collective import GroupFailure, ring
from ..protocol import dtypes
from ..protocol import messages as m
from ..protocol.transport import Connection, Endpoint, FrameStream, PeerId, TransportError
from . import _ring_data as rd
from ._state import LimitExceeded

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
MAX_RING_HOSTS = 4
"""Hosts a server tries for its successor's TCP data plane before it falls back to QUIC."""
MAX_SPARES = 4
"""Results of one group's recent all-reduces kept for reuse (several gradient buckets of
different sizes each step); charged to the owning session's memory quota while kept, and
freed with the group."""


class GroupMember:
    """This server's rank of one group (owned by one client session)."""

    def __init__(self, service: GroupService, msg: m.GroupSetup, session: Any) -> None:
        self.service = service
        self.id, self.rank, self.peers = msg.group_id, msg.rank, msg.peers
        self.size = len(msg.peers)
        self.capability = msg.capability
        self.timeout = max(msg.timeout_ms, 1) / 1000
        self.session = session
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
        self.linked_t = threading.Event()
        """``linked`` for the engine worker thread that runs the all-reduce."""
        self.succ_ctl: FrameStream | None = None
        self.pred_ctl: FrameStream | None = None
        self.data_out: rd.DataOut | QuicOut | None = None
        """Where this rank's ring data goes: the TCP data plane or the QUIC link's stream."""
        self.data_in: rd.DataIn | QuicIn | None = None
        self.tcp_in: rd.DataIn | None = None
        """The predecessor's TCP data link, once it connected and proved the key."""
        self.ring_key: bytes = b""
        """The key this rank offered its predecessor for the TCP data plane."""
        self.pred_plane = ""
        """The predecessor's RingPlane (``tcp``/``quic``; empty until it arrives)."""
        self._io_scopes: set[trio.CancelScope] = set()
        self._op_lock = threading.Lock()
        self._spares: list[np.ndarray] = []
        """Recent results (``_result_buffer``), reused once nothing else holds them; their
        bytes are charged to the session's quota and the server's limit (``_spare_bytes``)."""
        self._spare_bytes = 0
        self._spare_lock = threading.Lock()
        """Guards the spares and their charge: the engine worker keeps them, the loop frees
        them when the member ends (never held across a call into the loop)."""
        self._retaining = True
        """False once the member ended: a late all-reduce keeps nothing more."""
        self.op_deadline: float | None = None
        self._peer_data = {"succ": 0, "pred": 0}
        """What the neighbour's latest GroupBeat said of the TCP data link (bytes)."""
        self._peer_waiting = False
        self._stall = {"succ": 0.0, "pred": 0.0}
        """Since when (time.monotonic) the TCP data link on each side looks stalled: bytes
        sent that the receiver, waiting for them, does not get (0: not stalled)."""
        self.conns: list[Connection] = []
        self.nccl: Any = None
        self._nccl_id = trio.Event()
        self._nccl_bytes = b""
        self._seq = 0
        self._scope = trio.CancelScope()
        self._nursery: trio.Nursery | None = None
        self._progress = trio.lowlevel.ParkingLot()
        self._moved = {"succ": 0.0, "pred": 0.0}
        """When (time.monotonic) a piece last left (to the successor) or arrived (from the
        predecessor): a link busy with ring data is alive even if its heartbeats queue
        behind the data."""
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
                    self._set_linked()
                else:
                    nursery.start_soon(self._dial_successor)
                    with trio.move_on_after(SETUP_TIMEOUT):
                        while not self._links_up() and self.failure is None:
                            await self._progress.park()
                    if self.failure is None and not self._links_up():
                        late = self.succ if self.data_out is None else self.pred
                        what = "TCP data link" if self.pred_plane == "tcp" else "ring link"
                        self.fail(late, f"no {what} within {SETUP_TIMEOUT:g} s")
                    if self.failure is None and self.engine == "nccl":
                        await self._start_nccl()
                    self._set_linked()
                await trio.sleep_forever()
        self.ended.set()
        self._set_linked()
        with self._spare_lock:
            self._retaining = False
            self._drop_spares()
        for end in (self.data_out, self.tcp_in):
            if isinstance(end, rd.DataOut | rd.DataIn):
                end.close()
        for conn in self.conns:
            with trio.move_on_after(ABORT_GRACE):
                await conn.close("group closed", flush_timeout=ABORT_GRACE)

    def _links_up(self) -> bool:
        if not (self.succ_ctl and self.data_out and self.pred_ctl and self.pred_plane):
            return False
        if self.data_in is None:  # RingPlane arrived: the pipe it names
            if self.pred_plane == "tcp":
                if self.tcp_in is None:
                    return False
                self.data_in = self.tcp_in
            else:
                self.data_in = QuicIn(self)
        return True

    def _set_linked(self) -> None:
        self.linked.set()
        self.linked_t.set()

    def close(self) -> None:
        """Leave the group (loop thread): ranks waiting here fail, links close."""
        if not self.closed:
            self.closed = True
            if self.failure is None:
                self.failure = GroupFailure(self.id, -1, "", "the group was closed")
            self._wake_io()
            self._scope.cancel()
            self._set_linked()
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
        self._wake_io()
        if self.nccl is not None:
            self.nccl.abort()
        self._set_linked()
        self._progress.unpark_all()
        if self._nursery is not None:
            abort = m.encode(m.GroupAbort(self.id, rank, reason))
            for ctl in (self.succ_ctl, self.pred_ctl):
                if ctl is not None and ctl is not via:
                    self._nursery.start_soon(_send_quietly, ctl, abort)
            self._nursery.start_soon(self._close_after_grace)

    def _wake_io(self) -> None:
        """Unblock the all-reduce's threads (the failure is set): QUIC waits are cancelled,
        a TCP receive is woken without telling the peer (its sockets close after the grace,
        so the neighbours hear the GroupAbort first and do not blame this rank)."""
        for cs in list(self._io_scopes):
            cs.cancel()
        if self.tcp_in is not None:
            self.tcp_in.wake()

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
            link = m.GroupLink(m.PROTOCOL_VERSION, self.id, self.rank, self.capability, "", b"")
            await ctl.send_frame(m.encode(link))
            with trio.fail_after(SETUP_TIMEOUT):
                answer = await ctl.receive_frame() or b""
            reply = _link_answer(answer)
            if isinstance(reply, m.Error):
                raise TransportError(f"refused the link: {reply.message}{_older(reply)}")
            if not isinstance(reply, m.GroupLink) or reply.rank != self.succ:
                raise TransportError(f"answered the link with {type(reply).__name__}")
            self.succ_ctl = ctl
            if self._nursery is not None:  # beats flow while the TCP data link is tried
                self._nursery.start_soon(self._tend, ctl, self.succ, "succ")
            out, why = await self._dial_data_plane(reply, conn)
            if out is None:
                quic = await conn.open_stream()
                self.data_out = QuicOut(self, quic)
            else:
                self.data_out = out
            plane = self.data_out.plane
            log.info(
                "group %016x: ring data to rank %d over %s%s",
                self.id,
                self.succ,
                plane.upper(),
                f" (fallback: {why})" if why else _records(self.data_out),
                extra={"event": "ring_plane", "session": self.session_id},
            )
            await ctl.send_frame(m.encode(m.RingPlane(self.id, plane, why)))
        except (TransportError, OSError, ValueError, m.DecodeError, trio.TooSlowError) as exc:
            self.fail(self.succ, f"cannot link to it: {type(exc).__name__}: {exc}")
            return
        except Exception as exc:  # LimitExceeded (dial rate) and the like
            self.fail(self.succ, f"cannot link to it: {exc}")
            return
        self._progress.unpark_all()

    async def _dial_data_plane(
        self, reply: m.GroupLink, conn: Connection
    ) -> tuple[rd.DataOut | None, str]:
        """The TCP data link the successor offered (None and why not, then the data goes on
        the QUIC link): at the host this QUIC link reached it at unless it named one."""
        if not reply.ring_address:
            return None, "the successor offers no TCP data plane"
        if len(reply.ring_key) != 32:
            return None, "the successor's ring_key is not 32 bytes"
        try:
            host, port = _ring_target(reply.ring_address)
        except ValueError as exc:
            return None, f"ring_address {reply.ring_address!r}: {exc}"
        hosts = [host] if host else await self._successor_hosts(conn)
        tried = []
        for where in [f"{h}:{port}" for h in hosts[:MAX_RING_HOSTS]]:
            try:
                with trio.fail_after(2 * m.RING_CONNECT_TIMEOUT):
                    out = await trio.to_thread.run_sync(
                        rd.dial,
                        (where.rpartition(":")[0], port),
                        self.id,
                        self.rank,
                        reply.ring_key,
                        self.service.plain_ok,
                        abandon_on_cancel=True,
                    )
                return out, ""
            except (OSError, rd.LinkBroken, trio.TooSlowError) as exc:
                tried.append(f"{where}: {type(exc).__name__}: {exc}")
        return None, f"TCP data link to {'; '.join(tried) or 'no address of it'} failed"

    async def _successor_hosts(self, conn: Connection) -> list[str]:
        """Where the successor's host may be, best first: the host our QUIC connection
        reached it at, then the hosts this server resolves for it itself (its --peer
        flags, address book, signed relay record: a relayed or hole-punched QUIC
        connection's address is a tunnel's). Each is tried; the link key proves the
        right one."""
        from ._relay_glue import record_addresses

        svc = self.service
        pid = PeerId.parse(self.peers[self.succ])
        found = []
        router = getattr(svc.ep, "router", None)
        direct = getattr(router, "direct_path", None)
        real = direct(conn.remote_address) if direct is not None else None
        if real is not None:  # a hole-punched path: the peer's own address
            found.append(real[0])
        found.append(conn.remote_address[0])
        directory = getattr(svc.state, "peers", None)
        if directory is not None:
            found += [a[0] for a in directory.addresses(pid)]
        with trio.move_on_after(m.RING_CONNECT_TIMEOUT):
            found += [a[0] for a in await record_addresses(svc.ep, pid)]
        return list(dict.fromkeys(found))

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
        seen = [time.monotonic()]
        self._heard[side] = seen[0]

        async def beat() -> None:
            while True:
                await ctl.send_frame(m.encode(self._beat(side)))
                await trio.sleep(LINK_BEAT)

        async def watch() -> None:
            while True:
                await trio.sleep(LINK_BEAT)
                now = time.monotonic()
                if now - max(seen[0], self._moved[side]) > LINK_TIMEOUT:
                    self.fail(rank, f"silent for {LINK_TIMEOUT:g} s: dead or cut off")
                    return
                if self.op_deadline is not None and now > self.op_deadline:
                    self.fail(-1, f"all_reduce did not complete within {2 * self.timeout:g} s")
                    return
                stalled = self._stalled(side, now)
                if stalled:
                    self.fail(rank, stalled)
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
                        seen[0] = self._heard[side] = time.monotonic()
                        if isinstance(msg, m.GroupBeat):
                            self._peer_data[side] = msg.data
                            if side == "succ":
                                self._peer_waiting = bool(msg.waiting)
                        elif isinstance(msg, m.GroupAbort):
                            self.fail(self._blamed(msg.rank), msg.reason, via=ctl)
                        elif isinstance(msg, m.NcclId):
                            self._nccl_bytes = msg.unique_id
                            self._nccl_id.set()
                        elif isinstance(msg, m.RingPlane) and side == "pred":
                            self._take_plane(msg)
                nursery.cancel_scope.cancel()
        except (TransportError, m.DecodeError) as exc:
            self.fail(rank, f"link lost: {exc}")

    def _beat(self, side: str) -> m.GroupBeat:
        """A heartbeat; on a TCP data link, with how far the data got (module docstring of
        _ring_data: the neighbour's watchdog compares it with its own count)."""
        if side == "succ":
            out = self.data_out
            return m.GroupBeat(self.id, out.sent if isinstance(out, rd.DataOut) else 0, 0)
        inn = self.tcp_in
        if inn is None:
            return m.GroupBeat(self.id, 0, 0)
        since = inn.waiting_since
        waiting = since is not None and time.monotonic() - since > LINK_BEAT
        return m.GroupBeat(self.id, inn.received, int(waiting))

    def _stalled(self, side: str, now: float) -> str:
        """Why the TCP data link on ``side`` counts as cut (empty: it does not): for
        LINK_TIMEOUT its receiver has waited for bytes its sender has written, while both
        QUIC ends still beat (a TCP path cut under a live QUIC link)."""
        if side == "pred":
            inn = self.tcp_in
            since = inn.waiting_since if inn is not None else None
            stuck = inn is not None and since is not None and self._peer_data["pred"] > inn.received
            lost = self._peer_data["pred"] - (inn.received if inn is not None else 0)
            what = f"its ring data stopped arriving over the TCP data link ({lost} bytes sent, not received)"
        else:
            out = self.data_out
            sent = out.sent if isinstance(out, rd.DataOut) else 0
            stuck = (
                isinstance(out, rd.DataOut)
                and self._peer_waiting
                and sent > self._peer_data["succ"]
            )
            what = (
                f"it waits for ring data this server wrote to the TCP data link "
                f"({sent - self._peer_data['succ']} bytes)"
            )
        if not stuck:
            self._stall[side] = 0.0
            return ""
        if not self._stall[side]:
            self._stall[side] = now
        if now - self._stall[side] > LINK_TIMEOUT:
            return f"{what} for {LINK_TIMEOUT:g} s: the TCP path is cut"
        return ""

    def _take_plane(self, msg: m.RingPlane) -> None:
        if self.pred_plane or msg.plane not in m.RING_PLANES:
            self.fail(self.pred, f"sent RingPlane {msg.plane!r} (once: tcp or quic)")
            return
        self.pred_plane = msg.plane
        log.info(
            "group %016x: ring data from rank %d over %s%s",
            self.id,
            self.pred,
            msg.plane.upper(),
            f" (fallback: {msg.reason})" if msg.reason else _records(self.tcp_in),
            extra={"event": "ring_plane", "session": self.session_id},
        )
        self._progress.unpark_all()

    def deliver_tcp_in(self, inn: rd.DataIn) -> None:
        """The predecessor's TCP data link, authenticated (listener thread -> loop)."""
        if self.tcp_in is not None or self.closed or self.failure is not None:
            inn.close()
            return
        self.tcp_in = inn
        self._progress.unpark_all()

    def _blamed(self, rank: int) -> int:
        """The culprit to name for an abort that names ``rank``. A neighbour that stopped
        hearing this rank blames it, though from here the fault is the link to that
        neighbour (both servers are up): name the neighbour whose TCP data link looks
        stalled, else whose link went quiet first, as this rank's own watchdog would a
        moment later."""
        if rank != self.rank:
            return rank
        now = time.monotonic()
        for side in ("succ", "pred"):
            self._stalled(side, now)
        since = {side: t for side, t in self._stall.items() if t and now - t > LINK_TIMEOUT / 3}
        if since:  # the data link stalled longest (a moment's lag of the counters is not)
            return self.succ if min(since, key=since.__getitem__) == "succ" else self.pred
        quiet = min(self._heard, key=lambda side: max(self._heard[side], self._moved[side]))
        return self.succ if quiet == "succ" else self.pred

    # --- the ring all-reduce (an engine worker thread) -----------------------------------------
    def all_reduce(self, host: np.ndarray, op: str) -> np.ndarray:
        """This rank's part of the k-th all-reduce of the group: a new array; ``host``
        (C-contiguous) is only read. Runs on the engine worker thread that runs the graph:
        with both links on the TCP data plane, all of it there (``_ring_data.drive_tcp``);
        otherwise it receives and reduces there while one more thread sends (the network
        loop carries only the QUIC plane's frames)."""
        with self._op_lock:
            entered = time.time()
            out = self._all_reduce(host, op)
            if log.isEnabledFor(logging.DEBUG):  # bench/allreduce.py reads these times
                log.debug(
                    "all_reduce #%d (%d bytes, %s): entered %.6f, done %.6f",
                    self._seq - 1,
                    host.nbytes,
                    getattr(self.data_out, "plane", "-"),
                    entered,
                    time.time(),
                    extra={"event": "ring_all_reduce", "session": self.session_id},
                )
            return out

    def _all_reduce(self, host: np.ndarray, op: str) -> np.ndarray:
        seq, self._seq = self._seq, self._seq + 1
        self.linked_t.wait(SETUP_TIMEOUT)
        if self.failure is not None:
            raise self.failure
        if not self.linked_t.is_set():
            raise GroupFailure(self.id, -1, "", "the group was never started (GroupStart)")
        x = host.reshape(-1)
        if self.size == 1:
            return ring.finish(x.copy(), op, 1).reshape(host.shape)
        acc = self._result_buffer(x)
        self.op_deadline = time.monotonic() + 2 * self.timeout
        if isinstance(self.data_out, rd.DataOut) and isinstance(self.data_in, rd.DataIn):
            try:
                self._all_reduce_tcp(x, acc, seq, op)
            finally:
                self.op_deadline = None
            if self.failure is not None:
                raise self.failure
            return ring.finish(acc, op, self.size).reshape(host.shape)
        progress = rd.Progress()
        sender = threading.Thread(
            target=self._send_all, args=(x, acc, seq, op, progress), daemon=True
        )
        try:
            sender.start()
            self._receive_all(x, acc, seq, op, progress)
            while sender.is_alive() and self.failure is None:
                sender.join(LINK_BEAT)
        finally:
            self.op_deadline = None
            progress.stop()
        if self.failure is not None:
            raise self.failure
        return ring.finish(acc, op, self.size).reshape(host.shape)

    def _result_buffer(self, x: np.ndarray) -> np.ndarray:
        """Where the result goes: a former result of this group of the same dtype and size
        that nothing holds any more, else a new array. A fresh 64 MiB array costs the
        kernel 64 MiB of page zeroing on first touch, which perf measured at 37% of the CPU
        of a 2-rank 64 MiB all-reduce (gloo reduces in place and pays nothing)."""
        with self._spare_lock:
            spares = self._spares
            for i in range(len(spares)):
                # references: the list's and getrefcount's argument, none elsewhere (a view
                # of it holds it through .base), so no one can be reading or writing it
                if sys.getrefcount(spares[i]) == 2:
                    a = spares[i]
                    if a.dtype == x.dtype and a.size == x.size:
                        del spares[i]
                        spares.append(a)
                        return a
            a = np.empty_like(x)
            if self._retaining:
                self._retain(a)
            return a

    def _retain(self, a: np.ndarray) -> None:
        """Keep ``a`` as a spare, charged to the session (the spare lock is held). The
        result itself is already charged (the run's arena, then the session's tensor);
        keeping it past its use is what the charge is for. Past the quota or the server's
        limit the spares go first, and the all-reduce never fails for want of a spare: it
        only loses the reuse."""
        if len(self._spares) >= MAX_SPARES:
            self._uncharge(self._spares.pop(0).nbytes)
        try:
            self._charge(a.nbytes)
        except LimitExceeded as first:
            self._drop_spares()
            try:
                self._charge(a.nbytes)
            except LimitExceeded:
                log.info(
                    "group %016x: no result buffer kept for reuse (%s)",
                    self.id,
                    first,
                    extra={"event": "ring_spares_dropped", "session": self.session_id},
                )
                return
        self._spares.append(a)

    def _charge(self, nbytes: int) -> None:
        """Charge kept result bytes to the owning session (LimitExceeded past its quota, its
        peer's share or the server's limit), counting the result the session is about to
        store as well, so that storing it does not then find the quota short."""
        s, state = self.session, self.service.state
        state.check_peer_memory(s.peer_id, 2 * nbytes)
        held = s.nbytes + s.bulk_reserved + s.group_bytes + nbytes
        state.hold(nbytes, held, f"session {s.id} (group {self.id:016x}'s result buffers)")
        s.group_bytes += nbytes
        self._spare_bytes += nbytes

    def _uncharge(self, nbytes: int) -> None:
        self.service.state.hold(-nbytes)
        self.session.group_bytes -= nbytes
        self._spare_bytes -= nbytes

    def shed(self) -> None:
        """Free the spares now (the session needs the quota for tensors)."""
        with self._spare_lock:
            self._drop_spares()

    def _drop_spares(self) -> None:
        """Forget every spare and refund its charge (the spare lock is held)."""
        self._spares.clear()
        if self._spare_bytes:
            self._uncharge(self._spare_bytes)

    def _plan(self, acc: np.ndarray) -> ring.Plan:
        return ring.Plan(self.rank, self.size, acc.size, acc.itemsize)

    def _fail_here(self, rank: int, reason: str) -> None:
        """fail() from a worker thread (a no-op if the group already failed: that failure
        is what woke the thread)."""
        if self.failure is None:
            trio.from_thread.run_sync(self.fail, rank, reason, trio_token=self.service.token)

    def _all_reduce_tcp(self, x: np.ndarray, acc: np.ndarray, seq: int, op: str) -> None:
        """Both links on the TCP data plane: the whole all-reduce on this thread."""
        assert isinstance(self.data_out, rd.DataOut) and isinstance(self.data_in, rd.DataIn)
        mine = m.RingHeader(seq, dtypes.from_numpy(acc.dtype), acc.size, op)

        def check(frame: bytes) -> None:
            why = self._header_mismatch(frame, mine)
            if why:
                raise rd.HeaderMismatch(why)

        try:
            on_time = rd.drive_tcp(
                self._plan(acc),
                x,
                acc,
                self.data_out,
                self.data_in,
                m.encode(mine),
                check,
                self.timeout,
                lambda: self.failure is not None,
            )
        except rd.HeaderMismatch as exc:
            self._fail_here(self.pred, str(exc))
        except rd.LinkBroken as exc:
            culprit = {"succ": self.succ, "pred": self.pred}.get(exc.side, -1)
            self._fail_here(culprit, f"{exc} (all_reduce #{seq})")
        else:
            if not on_time:
                self._fail_here(
                    self.pred, f"did not reach all_reduce #{seq} within {self.timeout:g} s"
                )

    def _header_mismatch(self, frame: bytes, mine: m.RingHeader) -> str:
        """Why the predecessor's RingHeader frame is not this rank's (empty: it is)."""
        try:
            (head,) = m.decode(frame)
        except (m.DecodeError, ValueError):
            head = None
        if head == mine:
            return ""
        return (
            f"sent all_reduce #{getattr(head, 'seq', '?')} of "
            f"{getattr(head, 'dtype', '?')}[{getattr(head, 'count', '?')}] "
            f"op={getattr(head, 'op', '?')}; rank {self.rank} has #{mine.seq} of "
            f"{mine.dtype}[{mine.count}] op={mine.op}"
        )

    def _send_all(
        self, x: np.ndarray, acc: np.ndarray, seq: int, op: str, progress: rd.Progress
    ) -> None:
        out = self.data_out
        assert out is not None
        try:
            name = dtypes.from_numpy(acc.dtype)
            out.send_header(m.encode(m.RingHeader(seq, name, acc.size, op)))
            rd.send_pieces(self._plan(acc), x, acc, out, progress)
        except rd.LinkBroken as exc:
            self._fail_here(self.succ, f"{exc} (all_reduce #{seq})")
        except Exception as exc:  # never a silent dead sender: the group fails loudly
            self._fail_here(-1, f"all_reduce #{seq} failed sending: {exc!r}")
        finally:
            if self.failure is not None:
                progress.stop()

    def _receive_all(
        self, x: np.ndarray, acc: np.ndarray, seq: int, op: str, progress: rd.Progress
    ) -> None:
        inn = self.data_in
        assert inn is not None
        try:
            frame = inn.recv_header(self.timeout)
            if frame is None:
                self._fail_here(
                    self.pred, f"did not reach all_reduce #{seq} within {self.timeout:g} s"
                )
                return
            mine = m.RingHeader(seq, dtypes.from_numpy(acc.dtype), acc.size, op)
            why = self._header_mismatch(frame, mine)
            if why:
                self._fail_here(self.pred, why)
                return
            rd.receive_pieces(self._plan(acc), x, acc, inn, progress)
        except rd.LinkBroken as exc:
            self._fail_here(self.pred, f"{exc} (all_reduce #{seq})")
        finally:
            if self.failure is not None:
                progress.stop()

    async def _guarded(self, fn: Any, *args: Any, timeout: float | None = None) -> Any:
        """``await fn(*args)`` on the loop for a worker thread; cancelled when the group
        fails (``_CANCELLED``) or after ``timeout`` (``_LATE``)."""
        with trio.CancelScope() as cs:
            if timeout is not None:
                cs.deadline = trio.current_time() + timeout
            self._io_scopes.add(cs)
            try:
                if self.failure is not None:
                    return _CANCELLED
                return await fn(*args)
            except (TransportError, m.DecodeError) as exc:
                return rd.LinkBroken(f"link lost: {exc}")
            finally:
                self._io_scopes.discard(cs)
        return _LATE if self.failure is None else _CANCELLED

    def on_loop(self, fn: Any, *args: Any, timeout: float | None = None) -> Any:
        guarded = functools.partial(self._guarded, fn, *args, timeout=timeout)
        got = trio.from_thread.run(guarded, trio_token=self.service.token)
        if got is _CANCELLED:
            raise rd.LinkBroken("the group failed")
        if isinstance(got, rd.LinkBroken):
            raise got
        return got

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


_CANCELLED = object()
_LATE = object()


class QuicOut:
    """The fallback plane, sending: this rank's ring data as frames on the QUIC link's
    second stream (the loop's transport moves them; each piece is copied once)."""

    plane = "quic"

    def __init__(self, member: GroupMember, stream: FrameStream) -> None:
        self.member, self.stream = member, stream

    def send_header(self, frame: bytes) -> None:
        self.member.on_loop(self.stream.send_frame, frame)

    def send_piece(self, piece: memoryview) -> None:
        self.member.on_loop(self.stream.send_frame, bytes(piece))
        self.member._moved["succ"] = time.monotonic()  # noqa: SLF001


class QuicIn:
    """The fallback plane, receiving: the predecessor's second QUIC stream."""

    plane = "quic"

    def __init__(self, member: GroupMember) -> None:
        self.member = member
        self.stream: FrameStream | None = None

    def recv_header(self, timeout: float) -> bytes | None:
        member = self.member
        if self.stream is None:
            conn = member.pred_conn
            if conn is None:
                raise rd.LinkBroken("has no link")
            self.stream = member.on_loop(conn.accept_stream, timeout=timeout)
            if self.stream is _LATE:
                self.stream = None
                return None
        frame = member.on_loop(self.stream.receive_frame, timeout=timeout)
        if frame is _LATE:
            return None
        if frame is None:
            raise rd.LinkBroken("closed its link")
        return frame

    def recv_piece_into(self, dest: memoryview) -> None:
        assert self.stream is not None
        frame = self.member.on_loop(self.stream.receive_frame)
        if frame is None or len(frame) != len(dest):
            raise rd.LinkBroken("sent a malformed piece")
        dest[:] = frame
        self.member._moved["pred"] = time.monotonic()  # noqa: SLF001


def _records(end: Any) -> str:
    """How a TCP data link's records travel, for the log."""
    if not isinstance(end, rd.DataOut | rd.DataIn):
        return ""
    return " (AES-256-GCM)" if end.sealed else " (same host: authenticated, not encrypted)"


def _ring_target(address: str) -> tuple[str, int]:
    """GroupLink.ring_address as (host, port); host "" for ``:PORT`` (the successor's host,
    wherever this server reaches it)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("expected HOST:PORT or :PORT")
    return host.strip("[]"), int(port)


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
        return backend.from_numpy(member.all_reduce(host, op))


class GroupService:
    """The groups of one server: created by ``serve`` with its endpoint and a nursery."""

    def __init__(
        self,
        state: Any,
        ep: Endpoint,
        nursery: trio.Nursery,
        ring_port: int | None = 0,
        ring_advertise: str = "",
        seal_loopback: bool = False,
    ) -> None:
        """``ring_port``: where the TCP data plane listens, on the host of the endpoint's
        QUIC socket (0: a free port; None: no TCP data plane, the links' QUIC streams carry
        the ring data). ``ring_advertise``: the ``HOST:PORT`` predecessors dial instead
        (a port mapping or proxy in front of this server). ``seal_loopback``: encrypt
        same-host TCP data links too (by default their records are plain after the
        authenticated hello: the bytes never leave this host's kernel)."""
        self.plain_ok = not seal_loopback
        self.state, self.ep, self.nursery = state, ep, nursery
        self.token = trio.lowlevel.current_trio_token()
        self.members: dict[int, GroupMember] = {}
        self.listener: rd.RingListener | None = None
        self.ring_address = ""
        if ring_port is not None:
            host = ep.local_address[0]
            try:
                self.listener = rd.RingListener(host, ring_port, self._lookup, self.plain_ok)
            except OSError as exc:
                why = f"TCP ring data plane (--ring-port {ring_port}): {exc.strerror or exc}"
                raise OSError(exc.errno, why) from None
            self.ring_address = ring_advertise or f":{self.listener.address[1]}"
            log.info(
                "ring data plane: TCP on %s:%d",
                host,
                self.listener.address[1],
                extra={"event": "ring_listening"},
            )

    def _lookup(self, group_id: int, rank: int) -> Any:
        """RingListener's question (its thread): the key and the hand-over for a TCP data
        link from ``rank`` of ``group_id``, or why not."""
        member = self.members.get(group_id)
        if member is None or member.closed or member.failure is not None:
            return "no such group on this server"
        if rank != member.pred or not member.ring_key:
            return f"not this rank's predecessor (rank {member.pred}), or no GroupLink yet"
        if member.tcp_in is not None:
            return "its data link is already up"

        def deliver(inn: rd.DataIn) -> None:
            trio.from_thread.run_sync(member.deliver_tcp_in, inn, trio_token=self.token)

        return member.ring_key, deliver

    def shutdown(self) -> None:
        """The server stops: no more TCP data links."""
        if self.listener is not None:
            self.listener.close()

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
        peer = str(conn.peer_id)
        try:
            msg = m.read_group_link(first)
        except m.DecodeError as exc:
            await self._refuse_link(conn, ctl, exc)
            return
        member = self.members.get(msg.group_id)
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
        if self.listener is not None:
            member.ring_key = os.urandom(32)
        offer = self.ring_address if member.ring_key else ""
        answer = m.GroupLink(
            m.PROTOCOL_VERSION, member.id, member.rank, b"", offer, member.ring_key
        )
        await ctl.send_frame(m.encode(answer))
        await member.attach_predecessor(conn, ctl)

    async def _refuse_link(self, conn: Connection, ctl: FrameStream, exc: m.DecodeError) -> None:
        """A GroupLink this server cannot take: of another protocol version (VERSION, and the
        group it names fails at once, naming that rank and both versions, instead of
        waiting SETUP_TIMEOUT for a link that cannot come) or malformed (MALFORMED)."""
        peer = str(conn.peer_id)
        code = m.VERSION if isinstance(exc, m.VersionMismatch) else m.MALFORMED
        log.warning(
            "group link from %s... refused: %s",
            peer[:12],
            exc,
            extra={"event": "group_link_refused"},
        )
        told = str(exc)
        if isinstance(exc, m.VersionMismatch):
            told = (
                f"the successor speaks protocol version {m.PROTOCOL_VERSION}, the dialler "
                f"{exc.theirs} (every server of a group must run the same protocol version)"
            )
            member = self.members.get(exc.group_id)
            if member is not None and member.peers[member.pred] == peer:
                member.fail(member.pred, f"cannot link: {exc}")
        await ctl.send_frame(m.encode(m.Error(code, told, -1, 0)))
        await conn.close(told)


def _link_answer(frame: bytes) -> m.Message:
    """The successor's answer to a GroupLink: its GroupLink, or its Error. Raises
    VersionMismatch (naming both versions) for a GroupLink of another protocol version."""
    if m.is_group_link(frame):
        return m.read_group_link(frame)
    (reply,) = m.decode(frame)
    return reply


def _older(reply: m.Error) -> str:
    """A hint for a refusal from a server older than version 3: it could not read this
    server's GroupLink (it knows no version field there), so it cannot name its version."""
    if reply.code == m.VERSION or "GroupLink" not in reply.message:
        return ""
    return (
        f" (it could not read this server's GroupLink of protocol version "
        f"{m.PROTOCOL_VERSION}: it runs an older version)"
    )


is_group_link = m.is_group_link


__all__ = ["LINK_TIMEOUT", "GroupMember", "GroupService", "is_group_link"]
