"""Moving one all-reduce over a rank's two ring data links (``_ring_data``'s link ends):
``drive_tcp`` runs both directions of both TCP data links on one thread; ``send_pieces`` and
``receive_pieces`` are the two threads of a rank with a QUIC fallback link, paced by
``Progress``. Both follow ``engine.collective.ring``'s schedule: piece p of step k leaves
once piece p of step k - 1 arrived."""

from __future__ import annotations

import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from cryptography.exceptions import InvalidTag

from ..engine.collective import ring
from ..protocol import messages as m
from . import _ring_shm as shm
from ._ring_data import LENGTH, DataIn, DataOut, LinkBroken


class Progress:
    """Pieces received so far in one all-reduce; the sender waits on it (pipelining)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.count = 0
        self.stopped = False

    def advance(self, count: int) -> None:
        with self.cond:
            self.count = count
            self.cond.notify_all()

    def wait_for(self, count: int) -> bool:
        with self.cond:
            while self.count < count and not self.stopped:
                self.cond.wait()
            return not self.stopped

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()


PLAIN_PIECE_BYTES = 4 * ring.PIECE_BYTES
"""The unit of pipelining of a rank whose two data links both carry plain records (same
host). A plain link is one byte stream of the schedule's chunks in order, so where pieces
are cut is each end's own choice (a sealed link's records are ``ring.PIECE_BYTES`` at both
ends: a rank with a sealed link keeps that size). Bigger pieces cost fewer wake-ups and
Python turns per all-reduce: 3 ranks x 64 MiB on 2 cores, 1 -> 4 MiB (with drive_tcp's
waiting receive) measured 9-15 % less server CPU per all-reduce."""


def plan_for(rank: int, size: int, acc: np.ndarray, out: DataOut, inn: DataIn) -> ring.Plan:
    """The ring schedule ``drive_tcp`` runs for this rank over these two links."""
    piece = ring.PIECE_BYTES if out.sealed or inn.sealed else PLAIN_PIECE_BYTES
    return ring.Plan(rank, size, acc.size, acc.itemsize, piece)


class HeaderMismatch(Exception):
    """The predecessor's RingHeader is not this rank's (``drive_tcp``'s ``check`` says why)."""


def drive_tcp(
    plan: ring.Plan,
    x: np.ndarray,
    acc: np.ndarray,
    out: DataOut,
    inn: DataIn,
    header: bytes,
    check: Callable[[bytes], None],
    header_timeout: float,
    stopped: Callable[[], bool],
) -> bool:
    """One all-reduce over two TCP data links on this one thread, with no hand-over between
    threads (each costs a wake-up, which a loaded machine delays). A received piece lands
    in the result (opened there from its sealed record, or received there on a plain
    same-host link) and is reduced in place; piece p of step k is sent once piece p of
    step k - 1 arrived.

    Sends never block (``MSG_DONTWAIT``). With nothing to send until the next piece
    arrives, the thread waits for that whole piece inside one ``recv_into(MSG_WAITALL)``
    (the kernel copies each segment as it lands, while it is still in cache, and Python
    runs once per piece); only while a send is held up by a full socket, or the header is
    awaited, does it ``poll`` both links. False if the predecessor sent no header within
    ``header_timeout`` (it is late); raises LinkBroken (with its side) or HeaderMismatch
    (``check``'s), or LinkBroken once ``stopped()`` (the group failed)."""

    item = acc.itemsize
    xb, ab = x.view(np.uint8), acc.view(np.uint8)
    sends, recvs = plan.sends(), plan.receives()
    where = {(k, a): j for j, (k, a, _, _) in enumerate(recvs)}
    done = 0  # pieces received and reduced
    si = 0  # next piece to send
    pending = memoryview(out.seal_header(header))  # bytes of the record being sent
    # receiving: the header's length, the header, then each piece's record
    sealed, sealer = inn.sealed, inn.sealer
    tag = m.RING_TAG if sealed else 0
    head_len = bytearray(LENGTH.size)
    want = memoryview(head_len)
    got = 0
    stage = "length"
    head_size = 0
    landing: Any = ab  # a plain link's pieces land in the result itself
    direct = inn.shared  # reduce-scatter pieces are added where they lie in shared memory

    def receive(flags: int) -> int:
        if stage == "piece" and direct and recvs[done][3]:
            lo, hi = recvs[done][1] + got // item, recvs[done][2]
            return _reduce_some(inn, acc[lo:hi], x[lo:hi], flags)
        return _recv_some(inn, want[got:], flags)

    if sealed:
        biggest = max((b - a for _, a, b, _ in recvs), default=0) * item + tag
        if len(inn._buf) < biggest:  # noqa: SLF001 - the receiving end's reused buffer
            inn._buf = bytearray(biggest)  # noqa: SLF001
        landing = inn._buf  # noqa: SLF001
    deadline = time.monotonic() + header_timeout
    osock, isock = out.sock, inn.sock
    ofd, ifd = osock.fileno(), isock.fileno()
    send_event = getattr(osock, "send_event", select.POLLOUT)  # a full shared buffer: POLLIN
    osock.setblocking(True)  # each call says whether it may wait (MSG_DONTWAIT, MSG_WAITALL)
    isock.setblocking(True)
    isock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(RECV_WAIT))
    poller = select.poll()
    try:
        while True:
            if not pending and si < len(sends):
                k, a, b = sends[si]
                if k == 0 or done > where[(k - 1, a)]:
                    src = xb if k == 0 else ab  # ring.source
                    pending = out.seal_piece(src[a * item : b * item].data)
                    si += 1
            reading = done < len(recvs) or stage != "piece"
            if not pending and si == len(sends) and not reading:
                return True
            if stopped():
                raise LinkBroken("the group failed")
            if pending:
                pending = pending[_send_some(out, pending) :]
                if not pending:
                    continue  # the next piece may be ready to go too
            if not pending and stage == "piece" and reading:
                # nothing to send before this piece is in: wait for all of it in the kernel
                if inn.waiting_since is None:  # (since the last byte came: the watchdog's)
                    inn.waiting_since = time.monotonic()
                n = receive(socket.MSG_WAITALL)
            else:
                # a send waits for room (the successor is behind) or the header is awaited
                poller.register(ofd, send_event if pending else 0)
                poller.register(ifd, select.POLLIN if reading else 0)
                if inn.waiting_since is None and reading:
                    inn.waiting_since = time.monotonic()
                header_wait = stage == "length" and got == 0
                wait = LINK_POLL
                if header_wait:
                    wait = max(0.0, min(wait, deadline - time.monotonic()))
                # announced, in shared memory (poll cannot see those bytes: see SharedPipe)
                if reading and isinstance(isock, shm.SharedPipe) and isock.buffered:
                    events = {ifd: select.POLLIN}
                else:
                    events = dict(poller.poll(wait * 1000))
                if pending and events.get(ofd, 0):
                    pending = pending[_send_some(out, pending) :]
                if not (reading and events.get(ifd, 0)):
                    if header_wait and time.monotonic() > deadline:
                        return False
                    continue
                n = receive(socket.MSG_DONTWAIT)
            if not n:
                continue
            got += n
            if got < len(want):
                continue
            got = 0
            if stage == "length":
                (head_size,) = LENGTH.unpack(head_len)
                if not tag <= head_size <= m.RING_MAX_HEADER:
                    raise LinkBroken(f"sent a ring header record of {head_size} bytes", "pred")
                pad = -(inn.received + head_size) % m.RING_SHARED_ALIGN if inn.shared else 0
                want, stage = memoryview(bytearray(head_size + pad)), "header"
                continue
            if stage == "header":
                frame = bytes(want[:head_size])
                if sealed:
                    try:
                        frame = sealer.aead.decrypt(sealer.nonce(), want, sealer.aad)
                    except InvalidTag:
                        why = "sent a ring header that failed authentication"
                        raise LinkBroken(why, "pred") from None
                check(frame)
                stage = "piece"
            else:
                _, a, b, reduce = recvs[done]
                if sealed:
                    try:
                        sealer.aead.decrypt_into(
                            sealer.nonce(), want, sealer.aad, ab[a * item : b * item].data
                        )
                    except InvalidTag:
                        why = "sent ring data that failed authentication"
                        raise LinkBroken(why, "pred") from None
                if reduce and not direct:
                    np.add(acc[a:b], x[a:b], out=acc[a:b])
                done += 1
            want = _next_piece(recvs, done, item, tag, landing)
    finally:
        inn.waiting_since = None
        try:  # back to plain blocking calls (the two-thread path's receives never time out)
            isock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(0.0))
        except OSError:
            pass


def _send_some(out: DataOut, data: memoryview) -> int:
    """Bytes of ``data`` the successor's socket took now (0 when it is full)."""
    try:
        n = out.sock.send(data, socket.MSG_DONTWAIT)
    except BlockingIOError:
        return 0
    except OSError as exc:
        raise LinkBroken(f"its data link broke: {exc.strerror or exc}", "succ") from None
    out.sent += n
    return n


def _recv_some(inn: DataIn, view: memoryview, flags: int) -> int:
    """Bytes received into ``view`` (0 when none came: nothing there for ``MSG_DONTWAIT``,
    or RECV_WAIT passed for ``MSG_WAITALL``, which may also return part of ``view``)."""
    return _counted(inn, lambda: inn.sock.recv_into(view, 0, flags))


def _reduce_some(inn: DataIn, out: np.ndarray, base: np.ndarray, flags: int) -> int:
    """``_recv_some`` of a reduce-scatter piece on a shared-memory link: ``out = base +``
    the bytes received, read where they lie in the shared buffer; bytes taken."""
    return _counted(inn, lambda: inn.sock.recv_reduce(out, base, flags))  # type: ignore[union-attr]


def _counted(inn: DataIn, receive: Callable[[], int]) -> int:
    """``receive()``'s byte count, counted as arrived (0 when it would block); a broken or
    closed link raises LinkBroken on the predecessor's side."""
    try:
        n = receive()
    except BlockingIOError:
        return 0
    except OSError as exc:
        raise LinkBroken(f"its data link broke: {exc.strerror or exc}", "pred") from None
    if n == 0:
        raise LinkBroken("closed its data link", "pred")
    inn.waiting_since = None
    inn.received += n
    return n


def _timeval(seconds: float) -> bytes:
    """``struct timeval`` for SO_RCVTIMEO."""
    whole = int(seconds)
    return struct.pack("@ll", whole, int((seconds - whole) * 1_000_000))


def _next_piece(recvs: list, done: int, item: int, tag: int, landing: Any) -> memoryview:
    """Where the next piece's record is received: the start of the scratch buffer (sealed:
    it is opened into the result), or its place in the result itself (plain)."""
    if done >= len(recvs):
        return memoryview(landing)[:0]
    _, a, b, _ = recvs[done]
    if tag:
        return memoryview(landing)[: (b - a) * item + tag]
    return memoryview(landing)[a * item : b * item]


LINK_POLL = m.LINK_BEAT
"""Longest a data-plane thread waits in poll before it checks whether the group failed."""
RECV_WAIT = m.LINK_BEAT / 5
"""Longest one waiting ``recv_into(MSG_WAITALL)`` of ``drive_tcp`` blocks: then it returns
what arrived, so the group's failure is seen and ``DataIn.received`` (which the neighbour's
cut-link watchdog compares with what it sent) is never staler than this."""


def send_pieces(plan: ring.Plan, x: np.ndarray, acc: np.ndarray, out, progress: Progress) -> None:  # noqa: ANN001 - out: DataOut or the QUIC pipe of server/_groups.py
    """This rank's sends of one all-reduce, in schedule order: piece p of step k leaves
    once piece p of step k - 1 arrived (and was reduced)."""
    where = {(k, a): j for j, (k, a, _, _) in enumerate(plan.receives())}
    item = acc.itemsize
    xb, ab = x.view(np.uint8), acc.view(np.uint8)
    for k, a, b in plan.sends():
        if k and not progress.wait_for(where[(k - 1, a)] + 1):
            return
        src = xb if k == 0 else ab  # ring.source: the input at step 0, the result after
        out.send_piece(src[a * item : b * item].data)


def receive_pieces(
    plan: ring.Plan, x: np.ndarray, acc: np.ndarray, inp, progress: Progress
) -> None:  # noqa: ANN001 - inp: DataIn or the QUIC pipe
    """This rank's receives: each piece lands straight in the result, and a reduce-scatter
    piece then gets this rank's input added in place (ring.apply without a temporary)."""
    item = acc.itemsize
    ab = acc.view(np.uint8)
    for j, (_, a, b, reduce) in enumerate(plan.receives()):
        inp.recv_piece_into(ab[a * item : b * item].data)
        if reduce:
            np.add(acc[a:b], x[a:b], out=acc[a:b])
        progress.advance(j + 1)


__all__ = ["LINK_POLL", "PLAIN_PIECE_BYTES", "RECV_WAIT", "HeaderMismatch", "Progress",
           "drive_tcp", "plan_for", "receive_pieces", "send_pieces"]  # fmt: skip
