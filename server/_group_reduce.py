"""The ring all-reduce of one group member, on the engine worker thread that runs the graph
(``RingAllReduce``, a part of ``_groups.GroupMember``): over two TCP data links all of it on
that thread (``_ring_drive.drive_tcp``); otherwise (a QUIC fallback link) it receives and
reduces there while one more thread sends, and the QUIC pipes reach the server's loop
through :meth:`RingAllReduce.on_loop`. A broken link, a late predecessor or a header that is
not this rank's fails the group (``GroupMember.fail``, on the loop) naming the culprit."""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import trio

from ..engine.collective import GroupFailure, ring
from ..protocol import dtypes
from ..protocol import messages as m
from ..protocol.transport import Connection, FrameStream, TransportError
from . import _ring_data as rd
from . import _ring_drive as drive
from ._group_links import CANCELLED, LATE, SETUP_TIMEOUT, QuicIn, QuicOut

if TYPE_CHECKING:
    from ._group_buffers import ResultBuffers
    from ._group_service import GroupService

log = logging.getLogger("burn_remote.server")

LINK_BEAT = m.LINK_BEAT


class RingAllReduce:
    """The all-reduce half of ``GroupMember`` (its state is the member's: set up in
    ``GroupMember.__init__`` and by its links on the loop)."""

    id: int
    rank: int
    size: int
    pred: int
    succ: int
    timeout: float
    session_id: int
    service: GroupService
    failure: GroupFailure | None
    linked_t: threading.Event
    buffers: ResultBuffers
    op_deadline: float | None
    data_out: rd.DataOut | QuicOut | None
    data_in: rd.DataIn | QuicIn | None
    pred_ctl: FrameStream | None
    _op_lock: threading.Lock
    _seq: int
    _io_scopes: set[trio.CancelScope]

    if TYPE_CHECKING:

        def fail(self, rank: int, reason: str, via: FrameStream | None = None) -> None:
            """GroupMember's (on the loop)."""

    def all_reduce(self, host: np.ndarray, op: str) -> np.ndarray:
        """This rank's part of the k-th all-reduce of the group: a new array; ``host``
        (C-contiguous) is only read. Runs on the engine worker thread that runs the graph:
        with both links on the TCP data plane, all of it there (``_ring_drive.drive_tcp``);
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
        acc = self.buffers.take(x)
        self.op_deadline = time.monotonic() + 2 * self.timeout
        if isinstance(self.data_out, rd.DataOut) and isinstance(self.data_in, rd.DataIn):
            try:
                self._all_reduce_tcp(x, acc, seq, op)
            finally:
                self.op_deadline = None
            if self.failure is not None:
                raise self.failure
            return ring.finish(acc, op, self.size).reshape(host.shape)
        progress = drive.Progress()
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
                raise drive.HeaderMismatch(why)

        try:
            on_time = drive.drive_tcp(
                drive.plan_for(self.rank, self.size, acc, self.data_out, self.data_in),
                x,
                acc,
                self.data_out,
                self.data_in,
                m.encode(mine),
                check,
                self.timeout,
                lambda: self.failure is not None,
            )
        except drive.HeaderMismatch as exc:
            self._fail_here(self.pred, str(exc))
        except rd.LinkBroken as exc:
            culprit = {"succ": self.succ, "pred": self.pred}.get(exc.side, -1)
            self._fail_here(culprit, f"{exc} (all_reduce #{seq})")
        else:
            if not on_time:
                self._fail_here(self.pred, self._late(seq))

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
        self, x: np.ndarray, acc: np.ndarray, seq: int, op: str, progress: drive.Progress
    ) -> None:
        out = self.data_out
        assert out is not None
        with self._failing(self.succ, seq, progress):
            try:
                name = dtypes.from_numpy(acc.dtype)
                out.send_header(m.encode(m.RingHeader(seq, name, acc.size, op)))
                drive.send_pieces(self._plan(acc), x, acc, out, progress)
            except rd.LinkBroken:
                raise
            except Exception as exc:  # never a silent dead sender: the group fails loudly
                self._fail_here(-1, f"all_reduce #{seq} failed sending: {exc!r}")

    def _receive_all(
        self, x: np.ndarray, acc: np.ndarray, seq: int, op: str, progress: drive.Progress
    ) -> None:
        inn = self.data_in
        assert inn is not None
        with self._failing(self.pred, seq, progress):
            frame = inn.recv_header(self.timeout)
            if frame is None:
                self._fail_here(self.pred, self._late(seq))
                return
            mine = m.RingHeader(seq, dtypes.from_numpy(acc.dtype), acc.size, op)
            why = self._header_mismatch(frame, mine)
            if why:
                self._fail_here(self.pred, why)
                return
            drive.receive_pieces(self._plan(acc), x, acc, inn, progress)

    @contextlib.contextmanager
    def _failing(self, culprit: int, seq: int, progress: drive.Progress) -> Iterator[None]:
        """Around one thread of a two-thread all-reduce: a broken link fails the group
        naming ``culprit``, and once the group failed the other thread is stopped too."""
        try:
            yield
        except rd.LinkBroken as exc:
            self._fail_here(culprit, f"{exc} (all_reduce #{seq})")
        finally:
            if self.failure is not None:
                progress.stop()

    def _late(self, seq: int) -> str:
        return f"did not reach all_reduce #{seq} within {self.timeout:g} s"

    async def _guarded(self, fn: Any, *args: Any, timeout: float | None = None) -> Any:
        """``await fn(*args)`` on the loop for a worker thread; cancelled when the group
        fails (``CANCELLED``) or after ``timeout`` (``LATE``)."""
        with trio.CancelScope() as cs:
            if timeout is not None:
                cs.deadline = trio.current_time() + timeout
            self._io_scopes.add(cs)
            try:
                if self.failure is not None:
                    return CANCELLED
                return await fn(*args)
            except (TransportError, m.DecodeError) as exc:
                return rd.LinkBroken(f"link lost: {exc}")
            finally:
                self._io_scopes.discard(cs)
        return LATE if self.failure is None else CANCELLED

    def on_loop(self, fn: Any, *args: Any, timeout: float | None = None) -> Any:
        guarded = functools.partial(self._guarded, fn, *args, timeout=timeout)
        got = trio.from_thread.run(guarded, trio_token=self.service.token)
        if got is CANCELLED:
            raise rd.LinkBroken("the group failed")
        if isinstance(got, rd.LinkBroken):
            raise got
        return got

    @property
    def pred_conn(self) -> Connection | None:
        return self.pred_ctl._conn if self.pred_ctl is not None else None  # noqa: SLF001


__all__ = ["RingAllReduce"]
