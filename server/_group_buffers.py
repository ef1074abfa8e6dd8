"""A group member's former all-reduce results, kept for reuse and charged to the owning
session's memory quota.

A fresh 64 MiB result costs the kernel 64 MiB of page zeroing on first touch, which perf
measured at 37% of the CPU of a 2-rank 64 MiB all-reduce (gloo reduces in place and pays
nothing); so a member reuses a former result that nothing holds any more. What it keeps is
memory a peer made the server hold, so it is charged to that peer's session like its tensors
(``Session.group_bytes``, and the server's ``held``), gives way when the quota is short, and is
refunded when the member ends. The shared-memory buffer of a same-host data link the member
dials (``_ring_shm``) is memory the peer made the server hold as well: charged the same way
for as long as the member lives (``charge_link``).
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

import numpy as np

from ._state import LimitExceeded

log = logging.getLogger("burn_remote.server")

MAX_SPARES = 4
"""Results of one group's recent all-reduces kept for reuse (several gradient buckets of
different sizes each step); charged to the owning session's memory quota while kept, and
freed with the group."""


class ResultBuffers:
    """The spares of one group member. Thread-safe: the engine worker takes and keeps them,
    the loop frees them when the member ends, a session's store sheds them (the lock is never
    held across a call into the loop, so it cannot deadlock with the member's op lock)."""

    def __init__(self, group_id: int, session: Any, state: Any) -> None:
        self.group_id, self.session, self.state = group_id, session, state
        self._spares: list[np.ndarray] = []
        self._bytes = 0
        """Bytes charged for ``_spares``."""
        self._link_bytes = 0
        """Bytes charged for the shared-memory buffer of the member's outgoing data link."""
        self._lock = threading.Lock()
        self._retaining = True
        """False once the member ended: a late all-reduce keeps nothing more."""

    def take(self, x: np.ndarray) -> np.ndarray:
        """Where the result of an all-reduce of ``x`` goes: a former result of the same dtype
        and size that nothing holds any more, else a new array (kept if the quota allows)."""
        with self._lock:
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

    def shed(self) -> None:
        """Free the spares now (the session needs the quota for tensors)."""
        with self._lock:
            self._drop()

    def close(self) -> None:
        """The member ended: free the spares and keep no more; refund its data link's
        shared buffer."""
        with self._lock:
            self._retaining = False
            self._drop()
            self._refund_link()

    def charge_link(self, nbytes: int) -> bool:
        """Charge a shared-memory data link's buffer to the owning session until the member
        ends; False (nothing charged, logged) past its quota, its peer's share or the
        server's limit: the link then carries its bytes over TCP."""
        s, state = self.session, self.state
        with self._lock:
            if not self._retaining:  # the member ended meanwhile (an abandoned dial)
                return False
            try:
                state.check_peer_memory(s.peer_id, nbytes)
                held = s.nbytes + s.bulk_reserved + s.group_bytes
                why = f"session {s.id} (group {self.group_id:016x}'s shared-memory data link)"
                state.hold(nbytes, held, why)
            except LimitExceeded as exc:
                log.info(
                    "group %016x: ring data link over TCP, not shared memory (%s)",
                    self.group_id,
                    exc,
                    extra={"event": "ring_link_unshared", "session": s.id},
                )
                return False
            s.group_bytes += nbytes
            self._link_bytes += nbytes
            return True

    def refund_link(self) -> None:
        """The link did not take the shared buffer it was charged for."""
        with self._lock:
            self._refund_link()

    def _refund_link(self) -> None:
        if self._link_bytes:
            self.state.hold(-self._link_bytes)
            self.session.group_bytes -= self._link_bytes
            self._link_bytes = 0

    def _retain(self, a: np.ndarray) -> None:
        """Keep ``a`` as a spare, charged to the session (the lock is held). The result
        itself is already charged (the run's arena, then the session's tensor); keeping it
        past its use is what the charge is for. Past the quota or the server's limit the
        spares go first, and the all-reduce never fails for want of a spare: it only loses
        the reuse."""
        if len(self._spares) >= MAX_SPARES:
            self._uncharge(self._spares.pop(0).nbytes)
        try:
            self._charge(a.nbytes)
        except LimitExceeded as first:
            self._drop()
            try:
                self._charge(a.nbytes)
            except LimitExceeded:
                log.info(
                    "group %016x: no result buffer kept for reuse (%s)",
                    self.group_id,
                    first,
                    extra={"event": "ring_spares_dropped", "session": self.session.id},
                )
                return
        self._spares.append(a)

    def _charge(self, nbytes: int) -> None:
        """Charge kept result bytes to the owning session (LimitExceeded past its quota, its
        peer's share or the server's limit), counting the result the session is about to
        store as well, so that storing it does not then find the quota short."""
        s, state = self.session, self.state
        state.check_peer_memory(s.peer_id, 2 * nbytes)
        held = s.nbytes + s.bulk_reserved + s.group_bytes + nbytes
        state.hold(nbytes, held, f"session {s.id} (group {self.group_id:016x}'s result buffers)")
        s.group_bytes += nbytes
        self._bytes += nbytes

    def _uncharge(self, nbytes: int) -> None:
        self.state.hold(-nbytes)
        self.session.group_bytes -= nbytes
        self._bytes -= nbytes

    def _drop(self) -> None:
        """Forget every spare and refund its charge (the lock is held)."""
        self._spares.clear()
        if self._bytes:
            self._uncharge(self._bytes)


__all__ = ["MAX_SPARES", "ResultBuffers"]
