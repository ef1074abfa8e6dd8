"""RemoteDevice: the same Tensor API, with graphs run by a `burn-remote serve` peer.

The runtime queues messages and returns at once; only reads (``item``, ``numpy``),
``dev.sync()``, memory statistics and server-to-server moves wait for the server. Errors the
server found come back at the next of those, naming the op and the user's line.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from burn_remote.protocol import messages as m

from ._device import Device
from ._recorder import OpFailed
from ._remote_protocol import ClientProtocol, RemoteError
from ._tensor import Tensor, make_tensor

WAIT_TIMEOUT = float(os.environ.get("BURN_REMOTE_WAIT_TIMEOUT", "300"))
"""Seconds a read waits for its reply before raising (a dead server must not hang forever)."""
STEPS_PER_PACKET = 16
"""Compiled steps queued before they leave together without a read (one packet and one Sync
for all of them: sending costs the user's thread far more than queueing)."""
MAX_STEPS_AHEAD = 64
"""Compiled steps the client may run ahead of the last one the server acknowledged; past
this a step waits (back-pressure, so neither side queues without bound)."""


CLOSED = "this RemoteDevice is closed: create a new RemoteDevice(target) to connect again"


class RemoteRuntime:
    """The Runtime of a remote device (see ``_recorder.Runtime``), over a link."""

    copies_uploads = True
    """An upload is serialised at once (``ClientProtocol.upload``): the caller's array is
    free to change afterwards, so the device need not copy it first."""

    fresh_reads = True
    """Each read returns a new writable array nothing else holds (``Tensor.numpy`` need not
    copy it: a 1 GiB read costs 1 GiB, not 2)."""

    def __init__(self, link_factory: Any) -> None:
        self.lock = threading.RLock()
        """``cond``'s lock: the hot paths take it directly (a Condition's ``with`` is a
        Python-level call)."""
        self.cond = threading.Condition(self.lock)
        self.proto = ClientProtocol()
        self.link = link_factory(self.proto, self.cond)
        self._syncs: deque[tuple[int, int]] = deque()
        """(request id, steps it covers) of each Sync a compiled step queued, oldest first."""
        self._steps = 0
        """Compiled steps queued so far."""
        self._sent = 0
        """Of those, how many have been handed to the link."""
        self._acked = 0
        """Of those, how many the server is known to have run (a Sync's Ack or any reply)."""
        self._asked: dict[int, int] = {}
        """Request id -> compiled steps queued before it (its reply acknowledges them)."""

    # --- Runtime protocol -------------------------------------------------------------------
    def upload(self, tensor_id: int, array: np.ndarray) -> None:
        """Queue ``array`` for the server as ``tensor_id`` (serialised now: the caller may change the
        array at once); sent with the next batch, or now when the batch is full. Raises RemoteError
        when the connection is closed or failed for good."""
        with self.lock:
            proto = self.proto
            if proto.fatal is not None:
                raise RemoteError(proto.fatal)
            proto.upload(tensor_id, array)
            send = proto.should_send()
        if send:
            self.link.kick()

    def execute(self, capture: Any) -> None:
        """Queue a graph; a compiled step's replay (``capture.step``) is also counted as
        ``step_done`` counts one, under the same lock."""
        wait_for = None
        with self.lock:
            proto = self.proto
            if proto.fatal is not None:
                raise RemoteError(proto.fatal)
            proto.execute(capture)
            send = proto.should_send()
            if capture.step:
                more, wait_for = self._count_step()
                send = send or more
        if send:
            self.link.kick()
        if wait_for is not None:
            self._wait_ahead(wait_for)

    def step_done(self) -> None:
        """A compiled step was queued: steps leave every STEPS_PER_PACKET with a Sync, or
        with the next read (whichever is first); a step waits while more than MAX_STEPS_AHEAD
        are unacknowledged. A failed step is not raised here: its error comes with the next
        read or sync, as in an uncompiled loop. (A replay's capture is counted by
        ``execute`` itself: this is for a step that was recorded.)

        Sending the first step at once whenever the server was idle (after each read) was
        measured too: it cost ~30 us of this process's CPU per step (a packet out and its
        acknowledgement in, per read) for no wall-clock gain on loopback."""
        with self.lock:
            self._check()
            send, wait_for = self._count_step()
        if send:
            self.link.kick()
        if wait_for is not None:
            self._wait_ahead(wait_for)

    def _count_step(self) -> tuple[bool, int | None]:
        """One more step queued (``cond`` held): whether to send now (a Sync every
        STEPS_PER_PACKET steps), and the Sync to wait for when too far ahead."""
        proto, syncs = self.proto, self._syncs
        self._steps += 1
        while syncs and syncs[0][0] in proto.results:
            rid, steps = syncs.popleft()
            proto.results.pop(rid)
            self._acked = max(self._acked, steps)
        send = self._steps - self._sent >= STEPS_PER_PACKET
        if send:
            syncs.append((proto.request(m.Sync), self._steps))
            self._sent = self._steps
        if self._steps - self._acked > MAX_STEPS_AHEAD:
            if not syncs:
                syncs.append((proto.request(m.Sync), self._steps))
                send, self._sent = True, self._steps
            return send, syncs[0][0]
        return send, None

    def _wait_ahead(self, wait_for: int) -> None:
        """Back-pressure: wait for the Sync ``wait_for`` (the server ran the steps before it)."""
        proto = self.proto

        def answered() -> bool:
            return wait_for in proto.results or proto.fatal is not None

        left = self.link.wait(answered, WAIT_TIMEOUT, linger=False)  # more will follow
        with self.cond:
            if not self.cond.wait_for(answered, left):
                raise RemoteError(f"no reply from the server within {WAIT_TIMEOUT:.0f} s")
            self._check()

    def drop(self, ids: Sequence[int]) -> None:
        """Queue a free of ``ids`` on the server: they ride on the next message sent, so dropping
        costs no round trip."""
        with self.lock:
            self.proto.drop(ids)

    def read(self, tensor_id: int) -> np.ndarray:
        """The tensor's value as a new NumPy array: sends what is queued and waits (up to
        BURN_REMOTE_WAIT_TIMEOUT) for the reply. Raises OpFailed when a graph it depends on failed
        on the server, RemoteError when the server is gone or did not answer in time."""
        return self._call(m.Read, tensor_id)

    def request_read(self, tensor_id: int) -> Callable[[], np.ndarray]:
        """A Read queued now, before what is queued after it, and the call that takes its
        reply (sending what is pending first): the server runs messages in order, so the
        reply does not wait for work queued after the request (``Recorder.read_later``). The
        reply is an array of the caller's own (``fresh_reads``)."""
        rid = self._ask(m.Read, tensor_id, send=False)

        def take() -> np.ndarray:
            self.link.kick()
            return self._wait(rid)

        return take

    def read_item(self, tensor_id: int) -> float | int | bool:
        """A one-element tensor's value as a Python number (``Tensor.item``): the reply is
        unpacked straight into it, without an array on its way."""
        with self.lock:
            self._check()
            rid = self.proto.request_item(tensor_id)
            self._asked[rid] = self._sent = self._steps
        self.link.kick()
        try:
            return self._wait(rid)
        finally:
            self.proto._item_reads.discard(rid)  # (an error came instead of its Data)

    # --- waits ------------------------------------------------------------------------------
    def _check(self) -> None:
        if self.proto.fatal is not None:
            raise RemoteError(self.proto.fatal)

    def _call(self, kind: type, *fields: Any) -> Any:
        """Queue a request, send everything pending, wait for the reply; raise server errors."""
        return self._wait(self._ask(kind, *fields))

    def call_many(self, calls: Iterable[tuple[Any, ...]], window: int) -> Iterator[Any]:
        """Pipelined requests ``(kind, *fields)``: up to ``window`` in flight at once (a
        round trip per window, not per request); yields the replies in order and raises the
        first error (requests after it may have been sent)."""
        waiting: deque[int] = deque()
        calls = iter(calls)
        while True:
            while len(waiting) < window and (call := next(calls, None)) is not None:
                waiting.append(self._ask(*call))
            if not waiting:
                return
            yield self._wait(waiting.popleft())

    def _ask(self, kind: type, *fields: Any, send: bool = True) -> int:
        """Queue a request and send everything pending (``send=False``: leave it for the
        next ``send``, so a caller can queue every rank's request before sending any);
        its request id."""
        with self.lock:
            self._check()
            rid = self.proto.request(kind, *fields)
            self._asked[rid] = self._sent = self._steps
        if send:
            self.link.kick()
        return rid

    def _wait(self, rid: int) -> Any:
        """The reply to request ``rid`` (server errors raised)."""
        proto = self.proto

        def answered() -> bool:
            return rid in proto.results or proto.fatal is not None

        # Reads the reply in this thread. A device running compiled steps has replies
        # coming while nobody waits (each packet's Sync): its reader keeps the socket,
        # except while this thread waits for the last request it sent that gets a reply (a
        # read after the steps): every reply before it comes first, and nothing is owed
        # after it (an ExecuteGraph is answered only when it fails).
        linger = not self._steps or rid == proto.last_asked
        left = self.link.wait(answered, WAIT_TIMEOUT, linger=linger)
        with self.lock:
            done = answered() or self.cond.wait_for(answered, left)
            result = proto.results.pop(rid, None)
            error = proto.take_errors()
            steps = self._asked.pop(rid, 0)
            if done:  # the server ran every step queued before this request
                self._acked = max(self._acked, steps)
            if not done:
                raise RemoteError(f"no reply from the server within {WAIT_TIMEOUT:.0f} s")
            if result is None:
                self._check()
        if error is not None:
            raise error
        if isinstance(result, OpFailed):
            raise result
        return result

    def sync(self) -> None:
        """Send everything queued and wait until the server has run it; raises the first error
        (OpFailed, RemoteError) it reported."""
        self._call(m.Sync)

    def send(self) -> None:
        """Send what is queued now, without waiting for anything."""
        self.link.kick()

    def memory_stats(self) -> dict[str, int]:
        """The server session's memory as a dict (bytes in use and reserved, their peaks, tensors):
        one round trip."""
        r = self._call(m.MemoryStats, 0, 0, 0, 0, 0, 0, 0)
        return {k: v for k, v in dataclasses.asdict(r).items() if k != "request_id"}

    def expose(self, tensor_id: int, peer_id: str) -> bytes:
        """A 32-byte one-time token letting peer ``peer_id`` fetch this tensor's current value
        straight from this server (server-to-server move, no bytes through this client)."""
        return self._call(m.Expose, tensor_id, peer_id).token

    def fetch(self, tensor_id: int, source_peer: str, token: bytes) -> None:
        """Ask this server to pull ``source_peer``'s exposed tensor (``token`` from its `expose`)
        and hold it as ``tensor_id``; the server finds the source itself. Queued: a failure comes
        back with the next read."""
        with self.cond:
            self.proto.fetch(tensor_id, source_peer, token)

    def stats(self) -> dict[str, int]:
        """This client's counters of the connection (``ClientProtocol.Counters``): messages and bytes
        each way, graphs registered, replays, errors, transfers resumed."""
        with self.cond:
            return dataclasses.asdict(self.proto.counters)

    def close(self) -> None:
        """Send what is queued and close the connection; every later call raises RemoteError at once
        instead of waiting for a reply."""
        self.link.kick()
        self.link.close()
        with self.cond:  # every later call fails at once, never waits for a reply
            if self.proto.fatal is None:
                self.proto.fatal = CLOSED
            self.cond.notify_all()

    @property
    def failed(self) -> bool:
        """Closed, or the connection failed for good: a new device is needed."""
        return self.proto.fatal is not None


def parse_target(target: str) -> tuple[str, tuple[str, int] | None]:
    """'peer@host:port' or 'peer@[v6]:port' -> (peer, (host, port)); 'peer' -> (peer, None).
    (The one parser: ``burn_remote.protocol.addressing``.)"""
    from burn_remote.protocol.addressing import split_target

    return split_target(target)


def lookup_address(
    peer: str, book: str | Path | None = None, key: str | Path | None = None
) -> tuple[str, tuple[str, int]]:
    """(peer id, first address) of ``peer`` -- a peer id or a name -- in the address book
    (``$BURN_REMOTE_ADDRESS_BOOK``, else ``addresses.toml`` in the config home; its one
    format is ``[[peer]]`` tables, see ``protocol/transport/_addressing.py``). A peer not in
    the book is resolved by the transport's resolver hooks and relay.

    Raises:
        ValueError: the book is malformed, or no step knows an address for ``peer``.
    """
    from burn_remote.protocol.transport import (
        AddressBook,
        TransportError,
        default_address_book_path,
    )

    path = Path(book) if book else default_address_book_path()
    try:
        entry = AddressBook.load(path).lookup(peer)
    except TransportError as exc:
        raise ValueError(str(exc)) from None
    if entry is not None and entry.addresses:
        return str(entry.peer), entry.addresses[0]
    peer_id = str(entry.peer) if entry is not None else peer
    from burn_remote.protocol.relay import resolve_peer  # only a peer the book lacks loads it

    found = resolve_peer(peer_id, key_path=key)  # resolver hooks, then a configured relay
    if found is not None:
        return peer_id, found
    if entry is not None:
        raise ValueError(f"{peer}: the address book {path} lists it without addresses")
    if not path.exists():
        raise ValueError(f"{peer[:12]}...: no address given and no address book at {path}")
    raise ValueError(f"{peer[:12]}... is not in the address book {path}")


class RemoteDevice(Device):
    """A device whose tensors live on a `burn-remote serve` peer.

    ``RemoteDevice("peer-id@host:port")`` dials that address; ``RemoteDevice("peer-id")`` or
    ``RemoteDevice("name")`` looks the peer up in the address book (``[[peer]]`` tables). The same target (and key) gives the same device
    object while it works; after ``close()`` or a lost session it gives a fresh one, which
    connects again. Another ``key`` (this client's identity file) gives a separate session.
    Nothing is sent until the first read or flush; the connection opens then, on a thread
    (see ``_remote_link``: your thread sends each flushed step itself).
    """

    _remote: dict[str, RemoteDevice] = {}

    def __new__(cls, target: str, key: str | Path | None = None) -> RemoteDevice:
        dev = cls._remote.get(f"{target}|{key or ''}")
        if dev is None or dev._closed or dev._rt.failed:  # a dead device is not handed out
            dev = super().__new__(cls)
            dev._initialised = False
        return dev

    def __init__(self, target: str, key: str | Path | None = None) -> None:
        if getattr(self, "_initialised", False):
            return
        from ._remote_link import Link

        peer, address = parse_target(target)
        if address is None:  # a peer id or a name: the address book, then the relay
            peer, address = lookup_address(peer, key=key)
        from burn_remote.protocol.transport import PeerId

        self.peer_id = str(PeerId.parse(peer))
        self.address = address
        runtime = RemoteRuntime(
            lambda proto, cond: Link(self.peer_id, address, proto, cond, key_path=key)
        )
        super().__init__(f"remote:{self.peer_id}", runtime)
        self._rt = runtime
        self._target, self._key_file = target, key  # (not `_key`: Device._key draws keys)
        self._closed = False
        self._initialised = True
        RemoteDevice._remote[f"{target}|{key or ''}"] = self

    @classmethod
    def over(cls, runtime: RemoteRuntime, peer_id: str = "memory") -> RemoteDevice:
        """A remote device over any link (tests use an in-memory one)."""
        dev = super().__new__(cls)
        Device.__init__(dev, f"remote:{peer_id}", runtime)
        dev.peer_id, dev.address, dev._rt, dev._closed = peer_id, ("memory", 0), runtime, False
        dev._initialised = True
        return dev

    def __repr__(self) -> str:
        return f"RemoteDevice('{self.peer_id}@{self.address[0]}:{self.address[1]}')"

    def __reduce__(self) -> tuple:
        raise TypeError(
            f"cannot pickle a tensor or device on {self!r}: its values live on the server "
            "and a pickle cannot hold its session; pickle `t.numpy()` (or save a state_dict)"
        )

    def flush(self) -> None:
        """Send what is recorded as one message now (a step boundary) and return at once."""
        super().flush()
        self._rt.send()

    def sync(self) -> None:
        """Run everything recorded and wait until the server did; raises its errors."""
        super().sync()
        self._rt.sync()

    def stats(self) -> dict[str, int | str]:
        """Message and byte counters, and ``path``: how datagrams reach the server now --
        ``"direct host:port"``, or ``"relay"`` while a relayed session has no hole-punched
        path (it moves to one when both NATs allow it, and back when it fails)."""
        return {**super().stats(), "path": self.path()}

    def path(self) -> str:
        """``"direct host:port"`` or ``"relay"`` (see :meth:`stats`)."""
        agent = sys.modules.get("burn_remote.protocol.relay._agent")
        shown = agent.tunnel_path(self.address) if agent is not None else None
        return shown or f"direct {self.address[0]}:{self.address[1]}"

    def session_stats(self) -> dict[str, int]:
        """This session's and the whole server's tensor counts, bytes and peaks, live sessions."""
        self._rec.flush()
        return self._rt.memory_stats()

    def memory_stats(self) -> Any:
        """The server's memory as `engine.memory.MemoryStats`: a row for this session's
        tensors and one for all sessions' (the server's own quota is its limit)."""
        from burn_remote.engine.memory import MemoryStats, PoolStats

        s = self.session_stats()
        rows = (
            PoolStats("session", s["session_bytes"], s["session_bytes"], s["session_peak"],
                      s["session_peak"], s["session_tensors"], 0, 0),
            PoolStats("server", s["server_bytes"], s["server_bytes"], s["server_peak"],
                      s["server_peak"], s["server_tensors"], 0, 0),
        )  # fmt: skip
        return MemoryStats(
            self.spec, s["server_bytes"], s["server_bytes"], s["server_peak"], s["server_peak"],
            None, rows,
        )  # fmt: skip

    def memory_quota(self) -> tuple[int, int]:
        """(bytes this session holds, its quota): the server's ``--session-memory``, as its
        Welcome gave it; each tensor the session stores is charged against it."""
        held = self.session_stats()["session_bytes"]
        welcome = self._rt.proto.welcome
        if welcome is None or "session_memory" not in welcome.limits:
            raise RemoteError(f"{self!r}: the server's Welcome gave no session_memory limit")
        return held, int(welcome.limits["session_memory"])

    def memory_room(self) -> tuple[int, str]:
        """(bytes this session may still store, the limit that leaves that much: the
        server's ``--session-memory``, ``--peer-memory`` (its share for this peer) or
        ``--memory-limit``), one round trip: what to ask before making something large."""
        stats = self.session_stats()
        names = {
            m.ROOM_SESSION: "--session-memory",
            m.ROOM_PEER: "--peer-memory",
            m.ROOM_SERVER: "--memory-limit",
        }
        return int(stats["room"]), names.get(stats["room_limit"], "the server's memory limits")

    def server_status(self) -> dict[str, Any]:
        """The server's sessions, memory, plan cache, jobs and error counts (what
        ``burn-remote status`` prints). Only for admins and the server's own key.

        Raises:
            OpFailed: the server refused (FORBIDDEN: this peer is not an admin).
        """
        import json

        self._rec.flush()
        return json.loads(self._rt._call(m.ServerStatus).info)

    @property
    def jobs(self) -> Any:
        """Long-running jobs on this server (fine-tuning, export): see ``burn_remote.Jobs``."""
        from ._jobs import Jobs

        target, key = getattr(self, "_target", None), getattr(self, "_key_file", None)
        if target is None:  # RemoteDevice.over(...): no address to dial again
            return Jobs(self._rt)
        return Jobs(self._rt, reconnect=lambda: RemoteDevice(target, key)._rt)

    def close(self) -> None:
        """End the session (the server frees its tensors); the device cannot be used after."""
        self._rec.flush()
        self._rt.close()
        self._closed = True

    def _receive(self, t: Tensor) -> Tensor:
        src = t.device
        if not isinstance(src, RemoteDevice) or src is self:
            return super()._receive(t)
        # Server to server: the source grants a token bound to our server; ours fetches.
        src._rec.flush()
        token = src._rt.expose(t._id, self.peer_id)
        tid = self._rec.new_id()
        self._rt.fetch(tid, src.peer_id, token)  # our server finds the source itself
        self._rec.specs[tid] = (t.shape, t.dtype)
        out = make_tensor(self, tid, t.shape, t.dtype)
        if t.requires_grad:
            out.requires_grad_(True)
        return out


__all__ = ["RemoteDevice", "RemoteError", "RemoteRuntime", "lookup_address", "parse_target"]
