"""The device groups of one server: the client's group messages (GroupSetup, GroupStart,
GroupClose), the predecessors' GroupLinks, the TCP data plane's listener, and the handle a
session's graphs reach their group through. Each group is a ``GroupMember`` (``_groups``)."""

from __future__ import annotations

import hmac
import logging
import os
from typing import Any

import numpy as np
import trio

from ..protocol import messages as m
from ..protocol.transport import Connection, Endpoint, FrameStream, PeerId
from . import _ring_data as rd
from ._groups import GroupMember

log = logging.getLogger("burn_remote.server")

MAX_SESSION_GROUPS = 16
"""Groups one session may have open at once."""
ENGINES = ("ring", "nccl")

is_group_link = m.is_group_link


class MemberHandle:
    """What a session's scope maps a group id to: the kernel's way into the loop."""

    def __init__(self, member: GroupMember, token: trio.lowlevel.TrioToken) -> None:
        self.member, self.token = member, token

    def all_reduce(self, x: Any, op: str, backend: Any) -> Any:
        member = self.member
        if member.engine == "nccl" and member.nccl is not None:
            return member.nccl.all_reduce(x, op, backend, member)
        host = np.asarray(backend.to_numpy(x), order="C")  # no copy on the CPU backend
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
        shared_loopback: bool = True,
    ) -> None:
        """``ring_port``: where the TCP data plane listens, on the host of the endpoint's
        QUIC socket (0: a free port; None: no TCP data plane, the links' QUIC streams carry
        the ring data). ``ring_advertise``: the ``HOST:PORT`` predecessors dial instead
        (a port mapping or proxy in front of this server). ``seal_loopback``: encrypt
        same-host TCP data links too (by default their records are plain after the
        authenticated hello: the bytes never leave this host's kernel). ``shared_loopback``:
        such plain links go through a shared-memory buffer where both servers can map it."""
        self.plain_ok = not seal_loopback
        self.shared_ok = shared_loopback
        self.state, self.ep, self.nursery = state, ep, nursery
        self.token = trio.lowlevel.current_trio_token()
        self.members: dict[int, GroupMember] = {}
        self.listener: rd.RingListener | None = None
        self.ring_address = ""
        if ring_port is not None:
            host = ep.local_address[0]
            try:
                self.listener = rd.RingListener(
                    host, ring_port, self._lookup, self.plain_ok, self.shared_ok
                )
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


__all__ = ["ENGINES", "MAX_SESSION_GROUPS", "GroupService", "MemberHandle", "is_group_link"]
