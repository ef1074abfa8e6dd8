"""What every session of one server shares: the backend, the plan cache, limits, memory totals
and the one-time capabilities of server-to-server moves. Thread-safe: sessions run their
engine work in worker threads."""

from __future__ import annotations

import functools
import hashlib
import itertools
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engine.backend import Backend, get_backend
from ..engine.executor import PLAN_CACHE_SIZE, Executor, Plan, compile_graph
from ..protocol import dtypes
from ..protocol import messages as m
from ..protocol.bulk import BulkSend, byte_view
from ..protocol.extensions import check_graph_extensions, installed_extensions
from ..protocol.graph import MAX_GRAPH_NODES, Graph, GraphError, canonical, decode, validate
from ._fair import FairShare, engine_slots
from ._footprint import footprint, output_bytes, plan_bytes
from ._peers import PeerDirectory


@dataclass(frozen=True)
class Limits:
    """Resource limits; exceeding one gives the client a LIMIT error, never a crash."""

    max_frame: int = m.MAX_FRAME
    """Largest frame accepted on any stream."""
    max_sessions: int = 64
    """Concurrent sessions; the next Hello gets LIMIT and the connection closes."""
    max_tensors: int = 100_000
    """Tensors one session may hold."""
    max_graphs: int = 4096
    """Distinct graphs one session may register."""
    max_graph_nodes: int = MAX_GRAPH_NODES
    """Nodes in one registered graph."""
    session_memory: int = 8 * 2**30
    """Bytes of tensors one session may hold."""
    memory_limit: int = 32 * 2**30
    """Bytes of tensors all sessions together may hold."""
    plan_cache: int = PLAN_CACHE_SIZE
    """Compiled plans kept (LRU, shared by all sessions)."""
    max_peer_sessions: int = 16
    """Concurrent sessions of one peer (so one peer cannot take every slot)."""
    peer_memory: int | None = None
    """Bytes all sessions of one peer may hold together (tensors and transfers); 0: no
    per-peer cap beyond ``memory_limit``; None: PEER_MEMORY_SHARE of ``memory_limit`` when
    the server admits more than one peer (``ServerState.peer_memory_cap``)."""
    max_peer_jobs: int = 16
    """Jobs one peer may have queued or running."""
    peer_disk: int = 16 * 2**30
    """Bytes of artifacts and half-received uploads one peer may keep in the data dir."""
    disk_limit: int = 0
    """Bytes the whole data directory may hold before uploads and new jobs are refused (0:
    only the filesystem's reserve, ``jobs/_disk.py``)."""

    @functools.cached_property
    def bulk_threshold(self) -> int:
        """Tensor bytes above which data moves on bulk streams: BULK_THRESHOLD, less when a
        small frame limit could not carry that much inline."""
        return min(m.BULK_THRESHOLD, self.max_frame // 4)

    @functools.cached_property
    def bulk_chunk(self) -> int:
        """Largest raw-bytes frame of a bulk stream towards this server."""
        return min(m.BULK_CHUNK, self.max_frame)

    def as_welcome(self) -> dict[str, int]:
        return {
            "max_frame": self.max_frame,
            "max_tensors": self.max_tensors,
            "max_graphs": self.max_graphs,
            "session_memory": self.session_memory,
            "bulk_threshold": self.bulk_threshold,
            "bulk_chunk": self.bulk_chunk,
        }


PEER_MEMORY_SHARE = 0.75
"""Default share of the memory limit one peer may hold on a server that admits several
(several authorised peers, or ``--allow-any``): another peer always finds at least a quarter
free, whatever the first one does. A personal server (one authorised peer) keeps it all."""
SERVER_DIALS_PER_MINUTE = 60
"""Dials of other servers (a Fetch, a group link) one peer may cause a minute: each sends
handshakes to an address that peer may have published itself (``_peers.py``)."""
CAPABILITY_TTL = 600.0
"""Seconds an unredeemed capability (and the tensor it pins) lives."""
MAX_CAPABILITIES = 64
"""Unredeemed capabilities one session may hold."""
PEER_CAP_RECHECK = 1.0
"""Seconds the per-peer memory cap (``ServerState.peer_memory_cap``) is reused before the
authorized-peers file is looked at again: the cap is asked on every message that grows a
session's memory, and each look is a ``stat`` of the file. Admission (a handshake, a role)
still looks every time, so a peer removed from the file is refused at once; only the share
of memory a peer may hold follows an edit up to this late."""


_monotonic = time.monotonic
"""The clock of ``peer_memory_cap``'s reuse (tests move it)."""


class LimitExceeded(Exception):
    """A limit was hit; the message says which."""


class ServerState:
    """Shared by the sessions of one server process."""

    def __init__(
        self, device: str = "cpu", limits: Limits | None = None, peer_id: str = ""
    ) -> None:
        self.limits = limits or Limits()
        self.device = device
        self.backend: Backend = get_backend(device)
        self.executor = Executor(self.backend, self.limits.plan_cache)
        self.peer_id = peer_id
        self.lock = threading.Lock()
        self.compile_lock = threading.Lock()
        """Held while a plan compiles (not the ledger's ``lock``: see ``_compile``)."""
        self.sessions: dict[int, Any] = {}
        self.tensors = 0
        self.bytes = 0
        self.held = 0
        """Bytes charged that are not tensors (``hold``): bulk in flight, capabilities,
        plan constants, arenas."""
        self.peak_bytes = 0
        self.arenas = [0, 0]
        """The largest plan arena run since the last ``take_arena_need`` and before it: what
        the engine's next steps will allocate again (``_daemon._release_kept_memory``)."""
        self.extensions: dict[str, str] = installed_extensions()
        """Op extensions this server runs (entry points loaded by `serve`), name -> version."""
        self.started = time.monotonic()
        self.heartbeat = self.started
        """When the network loop last ticked (``/healthz`` reports a stalled loop)."""
        self.loop_lag = 0.0
        """How late the network loop's last heartbeat woke (seconds; /healthz)."""
        self.steps = 0
        """ExecuteGraph messages run by sessions that have ended (live ones count their own:
        ``Session.traffic``; ``traffic()`` adds them up for metrics)."""
        self.bytes_received = 0
        self.bytes_sent = 0
        """Tensor bytes uploaded by clients and read back by them, of ended sessions."""
        self.messages_closed = 0
        """Messages handled by sessions that have ended (live ones count their own)."""
        self._cap: tuple[float, int] = (-1.0, 0)
        """(until when, bytes): the per-peer cap last computed (``peer_memory_cap``)."""
        self.errors: dict[str, int] = {}
        """Errors by kind since start (``count_error``)."""
        self.resume_grace = 0.0
        """Seconds a session outlives a lost connection (set by `serve`; told in Welcome)."""
        self.jobs: Any = None
        """The job service (``server/jobs``) when the server has a data directory."""
        self.authorized: Any = None
        """The admission policy (an ``AuthorizedPeers``; set by ``serve``): peer roles."""
        self.collectives: Any = None
        """Device groups (``_group_service.GroupService``; set by ``serve``, None in-process)."""
        self.peers = PeerDirectory()
        """Where this server may dial other servers (``serve --peer``, its address book;
        ``_peers.dial_peer``): never an address a client sent."""
        self.fair = FairShare(engine_slots(device))
        """The engine's turns, shared fairly by peers and jobs (``_fair``)."""
        self._ids = itertools.count(1)
        self._dials: dict[str, list[float]] = {}
        """peer -> times of the recent dials of other servers it caused (``allow_dial``)."""
        self._plan_bytes: dict[str, int] = {}
        """digest -> bytes charged for a cached plan: its constants and its bookkeeping."""
        self._plan_users: dict[str, set[int]] = {}
        """digest -> sessions that registered it (the plan is released with the last)."""
        self._caps: dict[bytes, tuple[str, Any, int, int, float]] = {}
        """token -> (peer allowed, array, granting session, bytes charged, deadline)."""

    def is_admin(self, peer_id: str) -> bool:
        """Whether the authorised-peers file gives ``peer_id`` the ``admin`` role."""
        policy = self.authorized
        return policy is not None and policy.role(peer_id) == "admin"

    # --- sessions ---------------------------------------------------------------------------
    def open_session(self, session: Any) -> int:
        with self.lock:
            if len(self.sessions) >= self.limits.max_sessions:
                raise LimitExceeded(
                    f"the server already has {len(self.sessions)} sessions "
                    f"(max_sessions {self.limits.max_sessions})"
                )
            peer = getattr(session, "peer_id", "")
            mine = sum(1 for other in self.sessions.values() if other.peer_id == peer)
            if peer and mine >= self.limits.max_peer_sessions:
                raise LimitExceeded(
                    f"peer {peer[:12]}... already has {mine} sessions on this server "
                    f"(max_peer_sessions {self.limits.max_peer_sessions})"
                )
            sid = next(self._ids)
            self.sessions[sid] = session
            return sid

    def allow_dial(self, peer: str, now: float) -> None:
        """Count one outgoing dial (``_peers.dial_peer``) for ``peer``; LimitExceeded past
        SERVER_DIALS_PER_MINUTE in the last minute, so no peer can make the server send
        handshakes at a high rate (a relay record may list any address)."""
        with self.lock:
            recent = [t for t in self._dials.get(peer, ()) if t > now - 60.0]
            if len(recent) >= SERVER_DIALS_PER_MINUTE:
                raise LimitExceeded(
                    f"peer {peer[:12]}... caused {len(recent)} dials of other servers in the "
                    f"last minute (SERVER_DIALS_PER_MINUTE {SERVER_DIALS_PER_MINUTE})"
                )
            recent.append(now)
            self._dials[peer] = recent
            if len(self._dials) > 4 * self.limits.max_sessions:  # forget idle peers
                self._dials = {p: ts for p, ts in self._dials.items() if ts[-1] > now - 60.0}

    def peer_memory_cap(self) -> int:
        """Bytes one peer's sessions may hold (0: no cap of its own): ``--peer-memory`` when
        given, else PEER_MEMORY_SHARE of the memory limit when more than one peer may connect
        (a server with no admission policy is one process's own, in-process: no cap). The
        admitted peers are counted again at most every PEER_CAP_RECHECK seconds."""
        if self.limits.peer_memory is not None:
            return self.limits.peer_memory
        policy = self.authorized
        if policy is None:
            return 0
        now = _monotonic()
        until, cap = self._cap
        if now < until:
            return cap
        admitted = policy.admitted()
        cap = (
            0
            if admitted is not None and admitted <= 1
            else int(self.limits.memory_limit * PEER_MEMORY_SHARE)
        )
        self._cap = (now + PEER_CAP_RECHECK, cap)
        return cap

    def check_peer_memory(self, peer: str, nbytes: int) -> None:
        """Raise LimitExceeded when ``peer``'s sessions would hold more than its cap."""
        if nbytes <= 0 or not peer:  # first: the cap may reread the authorized-peers file
            return
        cap = self.peer_memory_cap()
        if not cap:
            return
        with self.lock:
            self._admit_peer(peer, nbytes, cap)

    def _peer_held(self, peer: str) -> int:
        """Bytes ``peer``'s sessions hold or have reserved (held lock)."""
        return sum(
            s.nbytes
            + getattr(s, "bulk_reserved", 0)
            + getattr(s, "group_bytes", 0)
            + getattr(s, "run_reserved", 0)
            for s in self.sessions.values()
            if s.peer_id == peer
        )

    def room(self, session: Any) -> tuple[int, int]:
        """(bytes ``session`` may still add before a limit refuses them, which limit that is:
        ``m.ROOM_SESSION``, ``m.ROOM_PEER`` or ``m.ROOM_SERVER``): what a client asks before
        making something large (a KV cache), so that it is refused by name before any work."""
        cap = self.peer_memory_cap() if session.peer_id else 0
        owner = session.nbytes + session.bulk_reserved + session.group_bytes
        with self.lock:
            rooms = [
                (self.limits.session_memory - owner, m.ROOM_SESSION),
                (self.limits.memory_limit - self.bytes - self.held, m.ROOM_SERVER),
            ]
            if cap:
                rooms.append((cap - self._peer_held(session.peer_id), m.ROOM_PEER))
        room, which = min(rooms)
        return max(room, 0), which

    def _admit_peer(self, peer: str, nbytes: int, cap: int) -> None:
        """The per-peer quota check (held lock): LimitExceeded when ``peer``'s sessions would
        hold more than ``cap``."""
        held = self._peer_held(peer)
        if held + nbytes > cap:
            raise LimitExceeded(
                f"peer {peer[:12]}... memory quota exceeded: {held} + {nbytes} bytes > {cap} "
                "(--peer-memory; by default 3/4 of --memory-limit on a server several peers "
                "use)"
            )

    def close_session(self, sid: int) -> None:
        self.revoke(sid)
        with self.lock:
            session = self.sessions.pop(sid, None)
            if session is not None:
                self.messages_closed += session.messages
                steps, received, sent = getattr(session, "traffic", (0, 0, 0))
                self.steps += steps
                self.bytes_received += received
                self.bytes_sent += sent
            peer = getattr(session, "peer_id", "")
            last = session is not None and not any(
                other.peer_id == peer for other in self.sessions.values()
            )
        if last:
            self.fair.forget(peer)
        if last and self.jobs is not None:  # its half uploads cannot resume: remove them
            self.jobs.store.drop_uploads(peer)

    def traffic(self) -> dict[str, int]:
        """Steps run, tensor bytes received and sent, messages handled: ended sessions'
        totals plus the live sessions' own counters (held lock)."""
        live = [(getattr(s, "traffic", (0, 0, 0)), s.messages) for s in self.sessions.values()]
        return {
            "steps": self.steps + sum(t[0] for t, _ in live),
            "bytes_received": self.bytes_received + sum(t[1] for t, _ in live),
            "bytes_sent": self.bytes_sent + sum(t[2] for t, _ in live),
            "messages": self.messages_closed + sum(n for _, n in live),
        }

    def account(
        self,
        tensors: int,
        nbytes: int,
        owner_bytes: int,
        owner: str = "session",
        peer: str = "",
        release: int = 0,
    ) -> None:
        """Charge (or, negative, refund) memory of one owner (a session, or ``job <id>``)
        that holds ``owner_bytes`` now; raises LimitExceeded past a quota. One lock for the
        whole update of a message: ``peer``'s own cap is checked here too (as
        ``check_peer_memory`` would), and ``release`` bytes held for the message's run (its
        arena, ``run(release=False)``) are returned first, whether the charge fits or not."""
        cap = self.peer_memory_cap() if peer and nbytes > 0 else 0
        with self.lock:
            self.held -= release
            if cap:
                self._admit_peer(peer, nbytes, cap)
            self._admit(nbytes, owner_bytes, owner)
            self.tensors += tensors
            self.bytes += nbytes
            if self.bytes > self.peak_bytes:
                self.peak_bytes = self.bytes

    def reserve_run(self, session: Any, nbytes: int) -> None:
        """Reserve what a run of replays may add (``_batch.start_run``): checked as every
        message of it would be (the peer's cap, the session's quota, the server's limit),
        held until ``settle_run``; the session shows its unused part (``run_reserved``) to
        the peer's other sessions' checks. LimitExceeded: it does not fit, nothing held."""
        peer = session.peer_id
        cap = self.peer_memory_cap() if peer and nbytes > 0 else 0
        owner_bytes = session.nbytes + session.bulk_reserved + session.group_bytes
        with self.lock:
            if cap:
                self._admit_peer(peer, nbytes, cap)
            self._admit(nbytes, owner_bytes, f"session {session.id}")
            self.held += nbytes
            session.run_reserved = nbytes

    def settle_run(self, reserve: int, tensors: int, nbytes: int, top: int = 0) -> None:
        """End of a run of replays: its reservation returned and what it stored (net of
        what it dropped) charged, in one update; the reservation covered it. ``top``: the
        most bytes it had added at once (the peak it reached)."""
        with self.lock:
            if self.bytes + top > self.peak_bytes:
                self.peak_bytes = self.bytes + top
            self.held -= reserve
            self.tensors += tensors
            self.bytes += nbytes
            if self.bytes > self.peak_bytes:
                self.peak_bytes = self.bytes

    def hold(self, nbytes: int, owner_bytes: int = 0, owner: str = "session") -> None:
        """Charge (or, negative, refund) bytes that are not a session's tensors but that a
        peer made the server hold: bulk streams in flight, exposed tensors, plan constants,
        arenas of running plans. They count against the owner's quota and the server's
        limit like tensors (``held``, beside ``bytes``)."""
        with self.lock:
            self._admit(nbytes, owner_bytes, owner)
            self.held += nbytes

    def _admit(self, nbytes: int, owner_bytes: int, owner: str) -> None:
        """The one quota check of the ledger (held lock): a charge fits the owner's quota
        and the server's limit, or LimitExceeded names which it breaks."""
        if nbytes <= 0:
            return
        if owner_bytes + nbytes > self.limits.session_memory:
            raise LimitExceeded(
                f"{owner} memory quota exceeded: {owner_bytes} + {nbytes} bytes > "
                f"{self.limits.session_memory} (--session-memory)"
            )
        if self.bytes + self.held + nbytes > self.limits.memory_limit:
            raise LimitExceeded(
                f"server memory limit exceeded by {owner}: {self.bytes + self.held} + {nbytes} "
                f"bytes > {self.limits.memory_limit} (--memory-limit)"
            )

    # --- graphs -----------------------------------------------------------------------------
    def plan(self, digest: str) -> Plan | None:
        with self.lock:
            return self.executor.plan(digest)

    def register(
        self, digest: str, graph_bytes: bytes, session_id: int = 0, session_bytes: int = 0
    ) -> Plan:
        """Decode, validate and compile; refuses a graph whose recomputed digest differs.
        The graph's constants are charged to the registering session before they are
        computed (LimitExceeded past its quota or the server's limit) and stay charged while
        any session that registered it is open; its arena must fit the server's limit."""
        graph = decode(graph_bytes, self.limits.max_graph_nodes)
        check_graph_extensions(graph, self.extensions)  # names what this server lacks
        validate(graph)
        graph = canonical(graph)  # equal graphs, one digest: the cache is shared
        actual = graph.digest()
        if actual != digest:
            if hashlib.sha256(graph_bytes).hexdigest() == digest:
                raise GraphError(
                    f"graph is not in canonical form (protocol/README.md, Canonical form): "
                    f"its canonical encoding hashes to {actual}; register it under that digest"
                )
            raise GraphError(f"digest mismatch: the graph hashes to {actual}, not {digest}")
        constants, peak = footprint(graph)
        outputs = output_bytes(graph)
        kept = constants + plan_bytes(graph)
        if kept + peak > self.limits.memory_limit:
            raise LimitExceeded(
                f"graph needs {constants} bytes of constants, {kept - constants} bytes of "
                f"compiled plan and up to {peak} bytes of intermediates; the server's memory "
                f"limit is {self.limits.memory_limit}"
            )
        with self.lock:
            plan = self.executor.plan(digest)
            known = plan is not None and digest in self._plan_bytes
        charged = 0 if known else kept
        self.hold(charged, session_bytes, f"session {session_id}")
        try:
            fresh = None if known else self._compile(graph)  # never under the ledger's lock
            with self.lock:
                plan = self.executor.plan(digest)
                if plan is None:
                    plan = self.executor.add(digest, fresh or self._compile(graph))
                plan.peak_bytes = peak
                plan.output_bytes = outputs
                if digest in self._plan_bytes:
                    self.held -= charged  # charged already (another session, a race)
                else:
                    self._plan_bytes[digest] = kept
                self._plan_users.setdefault(digest, set()).add(session_id)
                self._forget_evicted_plans()
        except BaseException:
            self.hold(-charged)
            raise
        return plan

    def _compile(self, graph: Graph) -> Plan:
        """Compile outside ``self.lock`` (a 100 000-node graph takes about a second, and
        every session's ledger and plan lookups take that lock); ``compile_lock`` keeps
        backends' code generation to one graph at a time, as before."""
        with self.compile_lock:
            return compile_graph(graph, self.backend)

    def release_plans(self, session_id: int, digests: Any) -> None:
        """A session ended: plans no open session registered leave the cache, and their
        constants leave the ledger."""
        with self.lock:
            for digest in digests:
                users = self._plan_users.get(digest)
                if users is None:
                    continue
                users.discard(session_id)
                if not users:
                    self.executor.evict(digest)
            self._forget_evicted_plans()

    def _forget_evicted_plans(self) -> None:
        """Refund the constants of plans the cache no longer holds (LRU or released)."""
        for digest in [d for d in self._plan_bytes if d not in self.executor]:
            self.held -= self._plan_bytes.pop(digest)
            self._plan_users.pop(digest, None)

    def run(
        self,
        plan: Plan,
        inputs: list[Any],
        values: Any,
        donated: list[int],
        owner_bytes: int = 0,
        owner: str = "session",
        release: bool = True,
    ) -> list[Any]:
        """Run a plan on the server's engine, timing it (``Plan.seconds``: whether its next
        replay fits on the network loop). Its arena (``Plan.peak_bytes``) is reserved in
        the ledger for the run: a run that does not fit is refused before it allocates.
        With ``release`` False a run that succeeds leaves the arena's bytes held for the
        caller to return with the outputs' charge (``account(release=plan.peak_bytes)``:
        one ledger update); a failed run always returns them."""
        peak = getattr(plan, "peak_bytes", 0)
        self.hold(peak, owner_bytes, owner)
        self.note_arena(peak)
        try:
            start = time.perf_counter()
            outs = self.executor.run(plan, inputs, values, donated)
            plan.seconds = time.perf_counter() - start
        except BaseException:
            self.hold(-peak)
            raise
        if release:
            self.hold(-peak)
        return outs

    def note_arena(self, nbytes: int) -> None:
        """A plan with an arena of ``nbytes`` runs (no lock: a lost update between two
        engine threads only delays a trim by one check)."""
        if nbytes > self.arenas[0]:
            self.arenas[0] = nbytes

    def take_arena_need(self) -> int:
        """The largest arena run in this check's window and the one before (a step that
        ran just before the last check still counts once more); starts a new window."""
        need = max(self.arenas)
        self.arenas = [0, self.arenas[0]]
        return need

    def count_error(self, kind: str) -> None:
        """An error worth an operator's attention (metrics count them by kind)."""
        with self.lock:
            self.errors[kind] = self.errors.get(kind, 0) + 1

    def compile(self, digest: str, graph: Graph) -> Plan:
        """The cached plan of an already validated graph (a job's own recording)."""
        with self.lock:
            plan = self.executor.plan(digest)
        if plan is not None:
            return plan
        fresh = self._compile(graph)
        with self.lock:
            return self.executor.plan(digest) or self.executor.add(digest, fresh)

    # --- capabilities -----------------------------------------------------------------------
    def grant(self, peer_id: str, array: Any, session_id: int = 0, session_bytes: int = 0) -> bytes:
        """A one-time token that lets ``peer_id`` (only) fetch ``array``. The array stays
        charged to the exposing session (its quota, the server's limit) until the token is
        redeemed, the session ends or ``CAPABILITY_TTL`` passes, whatever comes first."""
        nbytes = int(getattr(array, "nbytes", 0))
        with self.lock:
            self._expire_caps()
            held = [c for c in self._caps.values() if c[2] == session_id]
            if len(held) >= MAX_CAPABILITIES:
                raise LimitExceeded(
                    f"session {session_id} has {len(held)} unredeemed capabilities "
                    f"(MAX_CAPABILITIES {MAX_CAPABILITIES})"
                )
            exposed = sum(c[3] for c in held)
        self.hold(nbytes, session_bytes + exposed, f"session {session_id}")
        token = os.urandom(32)
        deadline = time.monotonic() + CAPABILITY_TTL
        with self.lock:
            self._caps[token] = (peer_id, array, session_id, nbytes, deadline)
        return token

    def redeem(self, token: bytes, peer_id: str) -> Any:
        """The exposed array, once; raises LookupError for a wrong token or peer."""
        with self.lock:
            self._expire_caps()
            entry = self._caps.get(token)
            if entry is None:
                raise LookupError("unknown, expired or already used capability token")
            if entry[0] != peer_id:
                raise LookupError("this capability token is bound to another peer")
            del self._caps[token]
            self.held -= entry[3]  # the bytes leave with the reply
        return entry[1]

    def welcome(self, session_id: int, token: bytes) -> m.Welcome:
        """The Welcome of a new or resumed session (the same fields either way)."""
        limits = self.limits.as_welcome()
        limits["resume_grace_ms"] = int(self.resume_grace * 1000)
        return m.Welcome(
            m.PROTOCOL_VERSION, session_id, token, self.peer_id, limits, dict(self.extensions)
        )

    def revoke(self, session_id: int) -> None:
        """Drop the capabilities a session granted (it ended): their arrays are freed."""
        with self.lock:
            for token, cap in list(self._caps.items()):
                if cap[2] == session_id:
                    del self._caps[token]
                    self.held -= cap[3]

    def _expire_caps(self) -> None:
        now = time.monotonic()
        for token, cap in list(self._caps.items()):
            if cap[4] < now:
                del self._caps[token]
                self.held -= cap[3]

    def serve_fetch(self, frame: bytes, peer_id: str) -> tuple[bytes, BulkSend | None]:
        """Source side of a server-to-server move: Fetch frame in, (Data frame, transfer)
        out; the transfer reads the tensor's memory (no copy on the CPU backend)."""
        try:
            (msg,) = m.decode(frame)
            if not isinstance(msg, m.Fetch):
                raise m.DecodeError(f"expected Fetch, got {type(msg).__name__}")
            array = self.redeem(msg.token, peer_id)
        except (m.DecodeError, ValueError, LookupError) as exc:
            return m.encode(m.Error(m.CAPABILITY, str(exc), -1, 0)), None
        host = host_array(self.backend, array)
        name = dtypes.from_numpy(host.dtype)
        send = BulkSend(1, byte_view(host), self.limits.bulk_chunk)
        return m.encode(m.Data(0, name, host.shape, b"", 1)), send


def host_array(backend: Backend, array: Any) -> np.ndarray:
    """A tensor's value as a C-contiguous host array of its own shape, for a Data reply (no
    copy on the CPU backend when it is contiguous). Not ``np.ascontiguousarray`` alone: it
    makes a 0-d array 1-d, and a scalar then read back as shape (1,)."""
    host = backend.to_numpy(array)
    return host if host.flags.c_contiguous else np.ascontiguousarray(host)


def nbytes_of(array: Any) -> int:
    """Bytes a stored array is charged for (0 for a missing one)."""
    return 0 if array is None else int(getattr(array, "nbytes", 0))


def replacement_cost(store: dict[int, Any], items: Any) -> tuple[int, int]:
    """(new ids, byte delta) of storing ``items`` over ``store``: what the ledger is
    charged before a session or a job keeps them (runs per message: no call per item)."""
    added = delta = 0
    get = store.get
    for tid, array in items:
        old = get(tid)
        delta += getattr(array, "nbytes", 0)
        if old is None:
            added += 1
        else:
            delta -= getattr(old, "nbytes", 0)
    return added, int(delta)


def pop_all(store: dict[int, Any], ids: Any) -> tuple[int, int]:
    """Remove ``ids`` from ``store``: (how many were there, their bytes) to refund."""
    count = freed = 0
    pop = store.pop
    for i in ids:
        a = pop(i, None)
        if a is not None:
            count += 1
            freed += getattr(a, "nbytes", 0)
    return count, int(freed)


__all__ = ["LimitExceeded", "Limits", "ServerState"]
