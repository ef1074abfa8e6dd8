"""One server's rank of a device group (``GroupMember``): its ring links to the neighbours,
their watchdog, and (``_group_reduce``, on the engine worker thread) the ring all-reduce
that runs over them. The server's groups and the client's group messages are
``_group_service``; the QUIC fallback pipes and link helpers ``_group_links``; the results
kept for reuse ``_group_buffers``; the TCP data plane ``_ring_data``.

A client makes this server rank r of a group (``GroupSetup``): the server admits the two
ring neighbours' peer ids (when they prove their keys) for group links only (they need not be in its
authorized peers: the client, who is, vouched for them), then on ``GroupStart`` dials its
successor itself (``_peers.dial_peer``: addresses this server resolves, never the client's)
and presents the group's one-time capability; its predecessor does the same towards it.
Each link carries, on its first stream, heartbeats both ways (``GroupBeat``), aborts
(``GroupAbort``) and NCCL's unique id; on its second stream, the dialler's data to its
successor: per all-reduce a ``RingHeader`` and the pieces of the ring schedule
(``engine/collective/ring.py``), sent as soon as they are reduced, so the ring pipelines.

Everything here runs on the server's trio loop. The ``all_reduce`` kernel runs on an engine
worker thread (``_group_reduce``), which moves the TCP data plane's bytes itself and reaches
the loop through ``trio.from_thread`` only for the QUIC fallback and to fail the group: the
loop keeps serving links (and other sessions) while it runs.

Faults: a link that closes, or whose peer is silent for ``LINK_TIMEOUT``, fails the group
naming that rank; the failure is forwarded on the other link so every surviving rank fails
the same way, and any collective under way or to come raises it (``GroupFailure`` -> error
``GROUP``). The server and its other sessions go on; the client closes the group and may
build a new one from the survivors.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import trio

from ..engine.collective import GroupFailure
from ..protocol import messages as m
from ..protocol.transport import Connection, FrameStream, PeerId, TransportError
from . import _ring_data as rd
from ._group_buffers import ResultBuffers
from ._group_links import (
    ABORT_GRACE,
    SETUP_TIMEOUT,
    QuicIn,
    QuicOut,
    link_answer,
    older_hint,
    records,
    ring_target,
    send_quietly,
)
from ._group_reduce import RingAllReduce
from ._ring_shm import SEGMENT_BYTES

if TYPE_CHECKING:
    from ._group_service import GroupService

log = logging.getLogger("burn_remote.server")

LINK_TIMEOUT = m.LINK_TIMEOUT
LINK_BEAT = m.LINK_BEAT
MAX_RING_HOSTS = 4
"""Hosts a server tries for its successor's TCP data plane before it falls back to QUIC."""
BLAME_SETTLED = LINK_TIMEOUT / 3
"""Seconds a data link's stall or a QUIC link's silence must last before ``_blamed`` takes
it as evidence over the other side's (heartbeats come every LINK_BEAT)."""


class GroupMember(RingAllReduce):
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
        self.buffers = ResultBuffers(self.id, session, service.state)
        """Former results reused for new ones, charged to the session."""
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
        self.buffers.close()
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
                    self._nursery.start_soon(send_quietly, ctl, abort)
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
            reply = link_answer(answer)
            if isinstance(reply, m.Error):
                raise TransportError(f"refused the link: {reply.message}{older_hint(reply)}")
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
                f" (fallback: {why})" if why else records(self.data_out),
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
            host, port = ring_target(reply.ring_address)
        except ValueError as exc:
            return None, f"ring_address {reply.ring_address!r}: {exc}"
        hosts = [host] if host else await self._successor_hosts(conn)
        tried = []

        def share() -> bool:
            """A same-host link may take a shared buffer if the session's quota holds it."""
            return self.service.shared_ok and self.buffers.charge_link(SEGMENT_BYTES)

        for where in [f"{h}:{port}" for h in hosts[:MAX_RING_HOSTS]]:
            self.buffers.refund_link()  # what a former try charged and did not use
            try:
                with trio.fail_after(2 * m.RING_CONNECT_TIMEOUT):
                    out = await trio.to_thread.run_sync(
                        rd.dial,
                        (where.rpartition(":")[0], port),
                        self.id,
                        self.rank,
                        reply.ring_key,
                        self.service.plain_ok,
                        share,
                        abandon_on_cancel=True,
                    )
                if not out.shared:
                    self.buffers.refund_link()
                return out, ""
            except (OSError, rd.LinkBroken, trio.TooSlowError) as exc:
                tried.append(f"{where}: {type(exc).__name__}: {exc}")
        self.buffers.refund_link()
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
            await self._send_beats(ctl, side)

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
        except* (TransportError, m.DecodeError) as group:  # a nursery wraps what it raises
            first: BaseException = group  # (a plain except let a closed link end the server)
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            self.fail(rank, f"link lost: {first}")

    async def _send_beats(self, ctl: FrameStream, side: str) -> None:
        """Heartbeats every LINK_BEAT until the group fails. None after: once this rank's
        receiver has stopped, a beat would tell the neighbour that nothing waits any more,
        and it could overtake the GroupAbort, so the neighbour would judge the abort
        without the evidence of the stalled link (it then named the wrong rank)."""
        while self.failure is None:
            await ctl.send_frame(m.encode(self._beat(side)))
            await trio.sleep(LINK_BEAT)

    def _beat(self, side: str) -> m.GroupBeat:
        """A heartbeat; on a TCP data link, with how far the data got (module docstring of
        _ring_data: the neighbour's watchdog compares it with its own count)."""
        if side == "succ":
            out = self.data_out
            return m.GroupBeat(self.id, out.sent if isinstance(out, rd.DataOut) else 0, 0)
        inn = self.tcp_in
        if inn is None:
            return m.GroupBeat(self.id, 0, 0)
        return m.GroupBeat(self.id, inn.received, int(_starving(inn, time.monotonic())))

    def _stalled(self, side: str, now: float) -> str:
        """Why the TCP data link on ``side`` counts as cut (empty: it does not): for
        LINK_TIMEOUT its receiver has waited for bytes its sender has written, while both
        QUIC ends still beat (a TCP path cut under a live QUIC link)."""
        if side == "pred":
            inn = self.tcp_in
            stuck = (
                inn is not None and _starving(inn, now) and self._peer_data["pred"] > inn.received
            )
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
            f" (fallback: {msg.reason})" if msg.reason else records(self.tcp_in),
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
        neighbour (both servers are up): name the neighbour as this rank's own watchdog
        would a moment later. Best evidence first: the side whose TCP data link has stalled
        longest (over BLAME_SETTLED); else a QUIC link silent for over twice that (on its
        way to LINK_TIMEOUT: a moment's lag of the data counters is no evidence against
        it); else the one side whose data link is stalled at all (an abort may outrun this
        rank's own watchdog by a beat or two; a loop that was starved of CPU for a second
        has not yet read the other link's queued beats, so a shorter silence is chance);
        else a link silent for over BLAME_SETTLED, else the quieter link."""
        if rank != self.rank:
            return rank
        now = time.monotonic()
        for side in ("succ", "pred"):
            self._stalled(side, now)
        stalled = {side: t for side, t in self._stall.items() if t}
        settled = {side: t for side, t in stalled.items() if now - t > BLAME_SETTLED}
        heard = {side: max(self._heard[side], self._moved[side]) for side in ("succ", "pred")}
        quiet = min(heard, key=heard.__getitem__)
        silent = now - heard[quiet]
        if settled:
            side = min(settled, key=settled.__getitem__)
        elif silent > 2 * BLAME_SETTLED or (silent > BLAME_SETTLED and len(stalled) != 1):
            side = quiet
        elif len(stalled) == 1:
            (side,) = stalled
        else:
            side = quiet
        if log.isEnabledFor(logging.DEBUG):  # which evidence decided, for a wrong name
            log.debug(
                "group %016x: an abort names this rank; stalled %s, heard %s ago: %s",
                self.id,
                {k: round(now - t, 2) for k, t in stalled.items()},
                {k: round(now - t, 2) for k, t in heard.items()},
                side,
                extra={"event": "group_blame", "session": self.session_id},
            )
        return self.succ if side == "succ" else self.pred

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


def _starving(inn: rd.DataIn, now: float) -> bool:
    """Whether a TCP data link's receiver has waited for over LINK_BEAT with nothing
    arriving: not when bytes wait unread in its socket (its thread is only starved of CPU;
    the path delivers)."""
    since = inn.waiting_since
    return since is not None and now - since > LINK_BEAT and not inn.unread()


__all__ = ["LINK_TIMEOUT", "SETUP_TIMEOUT", "GroupMember"]
