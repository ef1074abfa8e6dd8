"""A TCP listener that a stranger cannot exhaust: one thread and one selector loop for every
connection (no thread per connection), a cap on connections in flight and on those from one
IP address, one deadline per connection for all its work (not per ``recv``), and an accept
loop that outlives any exception. The ring's data port (``_ring_data``) and the operator's
HTTP port (``_http``) are both built on it: each says what to do when a connection's socket
is ready, and when to let it go.

Past a cap the *oldest* unfinished connection is closed to make room, not the newcomer: a
real client sends its request with its first segment and is through in microseconds, so the
oldest is a slow one, and refusing newcomers instead would let a few slow connections lock
everyone out.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from typing import Any

log = logging.getLogger("burn_remote.server")

ACCEPT_PAUSE = 0.1
"""Seconds a listener stops accepting after ``accept`` failed (out of file descriptors),
instead of spinning on a listening socket that stays readable."""
EVICTION_LOG_INTERVAL = 10.0
"""Seconds between two log lines about connections closed to make room."""
CLOSE_WAIT = 1.0
"""Seconds ``close`` waits for the loop to end."""
IDLE_WAKE = 60.0
"""Longest the loop sleeps with nothing in flight (it wakes at once on a connection)."""


class Slot:
    """One connection the loop holds: its socket, who it is, when it must be done, and what
    the listener keeps about it (``state``)."""

    __slots__ = ("conn", "addr", "host", "deadline", "state")

    def __init__(self, conn: socket.socket, addr: tuple, deadline: float) -> None:
        self.conn, self.addr, self.host = conn, addr, addr[0]
        self.deadline = deadline
        self.state: Any = None

    @property
    def where(self) -> str:
        host = f"[{self.addr[0]}]" if ":" in self.addr[0] else self.addr[0]
        return f"{host}:{self.addr[1]}"


class BoundedListener:
    """Subclasses implement ``ready(slot, events)`` and may override ``deadline_s`` and
    ``expired``; they end a connection with ``drop`` (closed) or ``release`` (handed on)."""

    name = "listener"
    """What the log lines call it."""

    def __init__(
        self, host: str, port: int, max_open: int, max_per_host: int, backlog: int = 64
    ) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.create_server((host, port), family=family, backlog=backlog)
        self.sock.setblocking(False)
        self.address: tuple[str, int] = self.sock.getsockname()[:2]
        self.max_open, self.max_per_host = max_open, max_per_host
        self.evicted = 0
        """Unfinished connections closed to make room for newer ones (a cap was reached)."""
        self._slots: dict[socket.socket, Slot] = {}
        self._per_host: dict[str, int] = {}
        self._evict_logged = float("-inf")
        self._closed = False
        self._paused_until = 0.0
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.sock, selectors.EVENT_READ)
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._thread: threading.Thread | None = None

    def start(self, thread_name: str) -> None:
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self._thread.start()

    # --- for subclasses -------------------------------------------------------------------
    def deadline_s(self) -> float:
        """Seconds a connection may take for all its work, from its accept."""
        raise NotImplementedError

    def ready(self, slot: Slot, events: int) -> None:
        """``slot``'s socket is readable/writable (``events``); raise nothing."""
        raise NotImplementedError

    def expired(self, slot: Slot) -> None:
        """``slot`` ran past its deadline: say so if need be (it is closed next)."""

    def watch(self, slot: Slot, events: int) -> None:
        """Wait for ``events`` (``selectors.EVENT_READ``/``EVENT_WRITE``) on ``slot``."""
        self._sel.modify(slot.conn, events)

    def open_count(self) -> int:
        """Connections in flight now."""
        return len(self._slots)

    def release(self, slot: Slot) -> None:
        """``slot`` leaves the loop, its socket still open (handed to someone else)."""
        if self._slots.pop(slot.conn, None) is None:
            return
        try:
            self._sel.unregister(slot.conn)
        except (KeyError, ValueError, OSError):
            pass
        left = self._per_host.get(slot.host, 1) - 1
        if left > 0:
            self._per_host[slot.host] = left
        else:
            self._per_host.pop(slot.host, None)

    def drop(self, slot: Slot) -> None:
        """``slot`` leaves the loop and is closed."""
        self.release(slot)
        slot.conn.close()

    # --- the loop ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._closed:
                try:
                    self._turn()
                except Exception:  # noqa: BLE001 - the loop outlives anything one turn meets
                    if self._closed:
                        break
                    log.exception("%s: unexpected error (it keeps listening)", self.name)
                    time.sleep(ACCEPT_PAUSE)
        finally:  # the loop's own sockets are closed here, never under its feet
            for slot in list(self._slots.values()):
                self.drop(slot)
            self._sel.close()
            for sock in (self.sock, self._wake_r, self._wake_w):
                sock.close()

    def _turn(self) -> None:
        now = time.monotonic()
        if self._paused_until and now >= self._paused_until:
            self._paused_until = 0.0
            self._sel.register(self.sock, selectors.EVENT_READ)
        wake = min((s.deadline for s in self._slots.values()), default=now + IDLE_WAKE)
        if self._paused_until:
            wake = min(wake, self._paused_until)
        for key, events in self._sel.select(max(0.0, wake - now)):
            if key.fileobj is self.sock:
                self._accept_all()
            elif key.fileobj is self._wake_r:
                return
            elif (slot := self._slots.get(key.fileobj)) is not None:  # type: ignore[call-overload]
                self.ready(slot, events)
        now = time.monotonic()
        for slot in [s for s in self._slots.values() if now >= s.deadline]:
            self.expired(slot)
            self.drop(slot)  # whatever expired() did, the slot is gone

    def _accept_all(self) -> None:
        while not self._closed:
            try:
                conn, addr = self.sock.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # out of file descriptors (EMFILE), or closed
                if self._closed:
                    return
                log.warning(
                    "%s: accept failed: %s (pausing %g s)",
                    self.name,
                    exc.strerror or exc,
                    ACCEPT_PAUSE,
                    extra={"event": "accept_failed"},
                )
                self._sel.unregister(self.sock)
                self._paused_until = time.monotonic() + ACCEPT_PAUSE
                return
            host = addr[0]
            if self._per_host.get(host, 0) >= self.max_per_host:
                self._evict([s for s in self._slots.values() if s.host == host])
            elif len(self._slots) >= self.max_open:
                self._evict(list(self._slots.values()))
            slot = Slot(conn, addr, time.monotonic() + self.deadline_s())
            try:
                conn.setblocking(False)
                self._sel.register(conn, selectors.EVENT_READ)
            except (OSError, ValueError):
                conn.close()
                continue
            self._slots[conn] = slot
            self._per_host[host] = self._per_host.get(host, 0) + 1

    def _evict(self, among: list[Slot]) -> None:
        oldest = min(among, key=lambda s: s.deadline)
        self.drop(oldest)
        self.evicted += 1
        now = time.monotonic()
        if now - self._evict_logged >= EVICTION_LOG_INTERVAL:
            self._evict_logged = now
            log.warning(
                "%s: connection from %s closed unfinished to make room (at most %d in "
                "flight, %d per address); %d closed so far",
                self.name,
                oldest.where,
                self.max_open,
                self.max_per_host,
                self.evicted,
                extra={"event": "connection_evicted"},
            )

    def close(self) -> None:
        """Stop listening (the loop closes its sockets as it ends). Waits a moment for it,
        not longer: it may be handing a connection to the very thread that closes it."""
        self._closed = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(CLOSE_WAIT)


__all__ = ["BoundedListener", "Slot"]
