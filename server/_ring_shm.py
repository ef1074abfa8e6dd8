"""A same-host ring data link's bytes through shared memory (protocol/README.md section 12,
mode 2): the dialler's byte stream (header and pieces, exactly what a plain TCP link
carries) goes through a ring buffer in a memfd both servers map, and the TCP connection
carries only u32 counts: ``n`` written (dialler to successor), ``n`` consumed and free again
(successor to dialler).

Why: on one host the TCP path costs two kernel copies per byte plus the TCP stack's own
work (skbs, softirq, ACKs); through the shared buffer the sender copies each byte in once,
and the receiver copies it out once or, for a reduce-scatter piece, adds it to its input
where it lies (``recv_reduce``). Measured on this project's 2-core machine (64 MiB in 4 MiB
pieces between two threads, one process): ~25-35 ms of CPU over loopback TCP against ~15 ms
through a shared buffer; three ranks on two cores are CPU-bound, so CPU per byte is what
the all-reduce's time is (bench/allreduce.py: 20-35 % less server CPU per all-reduce).

Safety: the memfd is the dialler's, sealed (``F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL``)
before the successor opens it as ``/proc/<pid>/fd/<fd>``, so neither end can change its
size under the other's mapping (a shrunk file would make the other's reads fault); the
successor checks the seals, the size and a 16-byte nonce that the dialler wrote at its
start and sent after its authenticated hello. The segment holds only this link's ring
data. Counts that would overrun the buffer break the link, naming the neighbour.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import select
import socket
import struct
import sys
import termios
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..protocol import messages as m

COUNT = struct.Struct(">I")
TRAILER = struct.Struct(">II16s")
"""What follows a mode-2 hello: the dialler's pid, the memfd's fd number there, the nonce."""
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
SEGMENT_BYTES = m.RING_SHARED_OFFSET + m.RING_SHARED_BYTES


@dataclass
class Segment:
    """One link's mapped memfd; ``fd`` is open only on the dialler until the answer."""

    map: mmap.mmap
    nonce: bytes
    fd: int = -1

    def close_fd(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def make_segment() -> Segment | None:
    """The dialler's new sealed segment, or None where this system has no memfd."""
    try:
        fd = os.memfd_create("burn-remote-ring", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except (AttributeError, OSError):
        return None
    try:
        os.ftruncate(fd, SEGMENT_BYTES)
        nonce = os.urandom(16)
        os.pwrite(fd, nonce, 0)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
        return Segment(mmap.mmap(fd, SEGMENT_BYTES), nonce, fd)
    except OSError:
        os.close(fd)
        return None


def trailer(seg: Segment) -> bytes:
    return TRAILER.pack(os.getpid(), seg.fd, seg.nonce)


def open_segment(data: bytes) -> tuple[Segment | None, str]:
    """The successor's mapping of the segment a mode-2 trailer names, or why not (then the
    link falls back to plain TCP): another mount or pid namespace, another user, a file
    that is not that sealed memfd of the right size, or a nonce that differs."""
    pid, num, nonce = TRAILER.unpack(data)
    path = f"/proc/{pid}/fd/{num}"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return None, f"cannot open {path}: {exc.strerror or exc}"
    try:
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError:
            return None, f"{path} is not a memfd"
        if seals & SEALS != SEALS:
            return None, f"{path} is not sealed against resizing"
        if os.fstat(fd).st_size != SEGMENT_BYTES:
            return None, f"{path} is not {SEGMENT_BYTES} bytes"
        seg = Segment(mmap.mmap(fd, SEGMENT_BYTES), nonce)
    except OSError as exc:  # mapping it failed (address space, a memory limit)
        return None, f"cannot map {path}: {exc.strerror or exc}"
    finally:
        os.close(fd)
    if seg.map[:16] != nonce:
        return None, f"{path} does not hold the dialler's nonce"
    return seg, ""


def unread_in(sock: socket.socket) -> int:
    """Bytes that reached ``sock`` and are not read yet (FIONREAD; 0 once it is closed)."""
    try:
        got = fcntl.ioctl(sock.fileno(), termios.FIONREAD, bytes(4))
    except (OSError, ValueError):
        return 0
    return int.from_bytes(got, sys.byteorder)


class SharedPipe:
    """One end of a shared-memory link, standing in for its TCP socket where the data
    plane reads and writes (``send``, ``sendall``, ``recv_into`` with the flags it uses);
    everything else is the TCP socket's. The dialler's end only sends, the successor's
    only receives, each on one thread at a time."""

    send_event = select.POLLIN
    """What ``poll`` waits for while a send finds the buffer full: the successor's counts
    (a TCP socket's is POLLOUT)."""

    def __init__(self, sock: socket.socket, seg: Segment) -> None:
        self.sock, self.seg = sock, seg
        self.ring = memoryview(seg.map)[m.RING_SHARED_OFFSET :]
        self._ring_array = np.frombuffer(seg.map, np.uint8, offset=m.RING_SHARED_OFFSET)
        self.cap = m.RING_SHARED_BYTES
        self.written = 0
        """Bytes the dialler put in the buffer (its count; the successor's: announced)."""
        self.freed = 0
        """Bytes the successor consumed (its count; the dialler's: as told so far)."""
        self._counts = bytearray()  # a partial u32 from the socket
        self._owed = 0  # consumed bytes not told yet (a count the socket could not take)

    # -- the socket's other uses -------------------------------------------------------------
    def fileno(self) -> int:
        return self.sock.fileno()

    def setblocking(self, flag: bool) -> None:
        self.sock.setblocking(flag)

    def settimeout(self, value: float | None) -> None:
        self.sock.settimeout(value)

    def setsockopt(self, *args: int | bytes) -> None:
        self.sock.setsockopt(*args)  # type: ignore[arg-type]

    def shutdown(self, how: int) -> None:
        self.sock.shutdown(how)

    def close(self) -> None:
        self.sock.close()

    @property
    def buffered(self) -> int:
        """Bytes announced and not consumed yet: ``poll`` on the socket cannot see them
        (their counts were read), so a receiver asks this first."""
        return self.written - self.freed

    def unread(self) -> int:
        """Bytes announced and not consumed yet, with counts still in the socket."""
        return self.buffered + unread_in(self.sock)

    # -- counts --------------------------------------------------------------------------------
    def _take_counts(self, flags: int) -> int:
        """Read what counts the socket holds (waiting for one unless MSG_DONTWAIT): their
        sum, or raises as the socket does (EOF: ``ConnectionResetError``)."""
        data = self.sock.recv(4096, flags)
        if not data:
            raise ConnectionResetError(errno.ECONNRESET, "closed its data link")
        buf = self._counts + data
        whole = len(buf) - len(buf) % COUNT.size
        total = sum(n for (n,) in COUNT.iter_unpack(bytes(buf[:whole])))
        self._counts = buf[whole:]
        return total

    def _tell(self, n: int) -> None:
        """The successor tells the dialler ``n`` more bytes are free (never waits: a count
        the socket cannot take now goes with the next)."""
        self._owed += n
        try:
            sent = self.sock.send(COUNT.pack(self._owed), socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        if sent == COUNT.size:
            self._owed = 0
        elif sent:  # a torn count would desynchronise the stream: finish it
            self.sock.sendall(COUNT.pack(self._owed)[sent:])
            self._owed = 0

    # -- the dialler ---------------------------------------------------------------------------
    def send(self, data: memoryview | bytes, flags: int = 0) -> int:
        """Bytes of ``data`` put in the buffer and announced; waits for room unless
        MSG_DONTWAIT (then BlockingIOError when there is none). A part that is all the room
        allows ends on a multiple of ``RING_SHARED_ALIGN`` bytes: never inside an element of
        a piece, which the successor reduces only whole."""
        while True:
            try:
                self._freed(self._take_counts(socket.MSG_DONTWAIT))
            except BlockingIOError:
                pass
            n = min(len(data), self.cap - (self.written - self.freed))
            if n < len(data):
                n -= n % m.RING_SHARED_ALIGN
            if n:
                break
            if flags & socket.MSG_DONTWAIT:
                raise BlockingIOError(errno.EAGAIN, "the shared buffer is full")
            self._freed(self._take_counts(0))
        at = self.written % self.cap
        first = min(n, self.cap - at)
        src = memoryview(data)
        self.ring[at : at + first] = src[:first]
        if n > first:
            self.ring[: n - first] = src[first:n]
        self.written += n
        self.sock.sendall(COUNT.pack(n))
        return n

    def sendall(self, data: memoryview | bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[self.send(view) :]

    def _freed(self, n: int) -> None:
        if self.freed + n > self.written:
            raise ConnectionResetError(
                errno.EPROTO,
                f"the successor freed {self.freed + n - self.written} bytes more "
                "of the shared buffer than were written",
            )
        self.freed += n

    # -- the successor -------------------------------------------------------------------------
    def recv_into(self, view: memoryview, nbytes: int = 0, flags: int = 0) -> int:
        """Bytes copied into ``view`` out of the buffer, as a socket's ``recv_into`` with
        these flags: MSG_DONTWAIT never waits (BlockingIOError when nothing is there);
        MSG_WAITALL waits for all of ``view`` (until the socket's receive timeout, which
        returns what came, or raises as the socket does when nothing came); otherwise it
        waits for some."""

        def copy(done: int, at: int, n: int) -> None:
            view[done : done + n] = self.ring[at : at + n]

        return self._consume(min(nbytes, len(view)) if nbytes else len(view), 1, flags, copy)

    def recv_reduce(self, out: np.ndarray, base: np.ndarray, flags: int = 0) -> int:
        """``out = base + (the next out.nbytes bytes, as out's dtype)`` read straight from
        the buffer, with no copy into ``out`` first; bytes consumed (whole elements), with
        ``recv_into``'s flags. The elements are aligned in the buffer: the header's padding
        (protocol §12) starts every all-reduce's pieces at a multiple of 8."""
        item = out.itemsize
        ring = self._ring_array

        def add(done: int, at: int, n: int) -> None:
            e, k = done // item, n // item
            np.add(base[e : e + k], ring[at : at + n].view(out.dtype), out=out[e : e + k])

        return self._consume(out.nbytes, item, flags, add)

    def _consume(
        self, want: int, item: int, flags: int, use: Callable[[int, int, int], None]
    ) -> int:
        """Hand up to ``want`` announced bytes (whole ``item``s) to ``use(done, at, n)`` (bytes
        ``at..at + n`` of the buffer, the ``done``-th onwards of this call's), free them and
        tell the dialler; waits for counts as ``recv_into``'s flags say."""
        got = 0
        while True:
            n = min(self.written - self.freed, want - got) // item * item
            if n > 0:
                at = self.freed % self.cap
                first = min(n, self.cap - at)
                use(got, at, first)
                if n > first:
                    use(got + first, 0, n - first)
                got += n
                self.freed += n
                self._tell(n)
            if got == want or (got and not flags & socket.MSG_WAITALL):
                return got
            if self._owed and not flags & socket.MSG_DONTWAIT:  # before waiting on the
                self.sock.sendall(COUNT.pack(self._owed))  # dialler: it may wait for room
                self._owed = 0
            try:
                more = self._take_counts(flags & socket.MSG_DONTWAIT)
            except (BlockingIOError, TimeoutError):
                if got:
                    return got
                raise
            if self.written + more - self.freed > self.cap:
                raise ConnectionResetError(
                    errno.EPROTO,
                    f"announced {self.written + more - self.freed} bytes in a shared buffer "
                    f"of {self.cap}",
                )
            self.written += more
