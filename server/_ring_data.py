"""The ring's TCP data plane: a group link's ring data over plain TCP, sealed with
AES-256-GCM, moved by threads with big ``sendall``/``recv_into`` calls (no per-packet Python):
the link's two ends and the handshake that authenticates them (``_ring_drive`` moves an
all-reduce over them).

Why not the link's QUIC stream: aioquic's per-datagram work is pure Python, which kept the
ring CPU-bound at ~0.1 GB/s on a 2-core machine. Why not TLS (``ssl``) over the TCP socket:
OpenSSL hands Python one 16 KiB record per ``recv_into`` (4096 calls per 64 MiB), which
measured 0.07 CPU-s to receive 64 MiB against 0.03 CPU-s for plain TCP + one AES-GCM
``decrypt_into`` per 1 MiB piece.

Security: the key is 32 fresh random bytes the *successor* makes per link and sends to its
predecessor inside their QUIC link (``GroupLink.ring_key``), which is already mutually
authenticated with the servers' Ed25519 identities and encrypted (TLS 1.3): only that
predecessor can seal records the successor accepts, and only that successor can answer the
dialler's hello. Every record is AES-256-GCM with a 96-bit nonce of direction (4 bytes) and
record counter (8 bytes), never reused under one key; the group id is the associated data.
A record that fails authentication (tampered, replayed, reordered, another key) fails the
group naming the neighbour.

Wire (protocol/README.md section 12): the dialler connects to the successor's
``ring_address`` and sends ``RING_MAGIC``, group id (u64), its rank (u64), then the sealed
``RING_HELLO`` (record 0 of direction 0); the successor answers the sealed ``RING_HELLO``
(record 0 of direction 1). From then on only the dialler sends: per all-reduce a sealed
``RingHeader`` frame after its u32 length, then each piece of the ring schedule as one sealed
record (piece bytes + 16-byte tag; the receiver knows every piece's length from the header).
Between servers of one host the records are plain (the hello's mode byte 1), and the dialler
may offer a shared-memory buffer for them (mode 2: ``_ring_shm``; the TCP connection then
carries only byte counts).
"""

from __future__ import annotations

import logging
import socket
import struct
import time
from collections.abc import Callable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..protocol import messages as m
from . import _ring_shm as shm
from ._listener import BoundedListener, Slot

log = logging.getLogger("burn_remote.server")

PREAMBLE = struct.Struct(">8sQQ")
"""RING_MAGIC, group id, the dialler's rank."""
LENGTH = struct.Struct(">I")
HELLO_RECORD = len(m.RING_HELLO) + 1 + m.RING_TAG
"""RING_HELLO and the mode byte (1: plain records, 0: sealed), sealed."""
PLAIN, SEALED, SHARED = b"\x01", b"\x00", b"\x02"
TO_SUCCESSOR, TO_DIALLER = 0, 1
"""Nonce directions."""


class LinkBroken(Exception):
    """The data link failed (closed, reset, unauthentic data); ``side`` says which link
    (``succ``: the one this rank sends on; ``pred``: the one it receives on)."""

    def __init__(self, message: str, side: str = "") -> None:
        super().__init__(message)
        self.side = side


class _Sealer:
    """AES-256-GCM of one direction of one link: nonce = direction || record counter."""

    def __init__(self, key: bytes, direction: int, group_id: int) -> None:
        self.aead = AESGCM(key)
        self.prefix = direction.to_bytes(4, "big")
        self.aad = group_id.to_bytes(8, "big")
        self.count = 0

    def nonce(self) -> bytes:
        n, self.count = self.count, self.count + 1
        return self.prefix + n.to_bytes(8, "big")


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)


def same_host(sock: socket.socket) -> bool:
    """Whether the connection's other end is a loopback address (its bytes never leave
    this host's kernel)."""
    import ipaddress

    try:
        ip = ipaddress.ip_address(sock.getpeername()[0].split("%")[0])
    except (OSError, ValueError):
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise LinkBroken("closed the data link")
        got += k
    return bytes(buf)


class DataOut:
    """The dialler's end of a TCP data link: it only sends (one thread at a time). On a
    shared-memory link ``sock`` is the ``_ring_shm.SharedPipe`` in front of the socket."""

    plane = "tcp"

    def __init__(
        self, sock: socket.socket | shm.SharedPipe, sealer: _Sealer, sealed: bool = True
    ) -> None:
        self.sock, self.sealer, self.sealed = sock, sealer, sealed
        self.shared = isinstance(sock, shm.SharedPipe)
        self.sent = 0
        """Bytes handed to the socket (counted before ``sendall``: the watchdog compares
        it with what the successor says it read)."""
        self._buf = bytearray()

    def seal_header(self, frame: bytes) -> bytes:
        """The header's record, padded on a shared-memory link (``m.RING_SHARED_ALIGN``;
        ``sent`` is where it starts: every byte before it is sent)."""
        if not self.sealed:
            record = LENGTH.pack(len(frame)) + frame
            if self.shared:
                record += bytes(-(self.sent + len(record)) % m.RING_SHARED_ALIGN)
            return record
        sealed = self.sealer.aead.encrypt(self.sealer.nonce(), frame, self.sealer.aad)
        return LENGTH.pack(len(sealed)) + sealed

    def seal_piece(self, piece: memoryview) -> memoryview:
        """The record of ``piece``: sealed in a buffer reused by the next call, or the
        piece itself on a plain (same-host) link."""
        if not self.sealed:
            return piece
        need = len(piece) + m.RING_TAG
        if len(self._buf) < need:
            self._buf = bytearray(need)
        out = memoryview(self._buf)[:need]
        self.sealer.aead.encrypt_into(self.sealer.nonce(), piece, self.sealer.aad, out)
        return out

    def send_header(self, frame: bytes) -> None:
        self._send(self.seal_header(frame))

    def send_piece(self, piece: memoryview) -> None:
        self._send(self.seal_piece(piece))

    def _send(self, data: bytes | memoryview) -> None:
        self.sent += len(data)
        try:
            self.sock.sendall(data)
        except OSError as exc:
            raise LinkBroken(f"its data link broke: {exc.strerror or exc}") from None

    def close(self) -> None:
        _close(self.sock)


class DataIn:
    """The successor's end of a TCP data link: it only receives (one thread at a time). On
    a shared-memory link ``sock`` is the ``_ring_shm.SharedPipe`` in front of the socket."""

    plane = "tcp"

    def __init__(
        self, sock: socket.socket | shm.SharedPipe, sealer: _Sealer, sealed: bool = True
    ) -> None:
        self.sock, self.sealer, self.sealed = sock, sealer, sealed
        self.shared = isinstance(sock, shm.SharedPipe)
        self.received = 0
        self.waiting_since: float | None = None
        """Since when the receiver has been blocked on the socket with nothing arriving."""
        self._buf = bytearray()

    def unread(self) -> int:
        """Bytes that reached this host's socket and are not read yet (FIONREAD). A
        receiver whose thread is merely starved of CPU has them; a cut path leaves none, so
        the cut-link watchdog counts them as arrived."""
        if isinstance(self.sock, shm.SharedPipe):
            return self.sock.unread()
        return shm.unread_in(self.sock)

    def _fill(self, view: memoryview) -> None:
        got, n = 0, len(view)
        while got < n:
            self.waiting_since = time.monotonic()
            try:
                k = self.sock.recv_into(view[got:])
            except TimeoutError:
                raise
            except OSError as exc:
                raise LinkBroken(f"its data link broke: {exc.strerror or exc}") from None
            finally:
                self.waiting_since = None
            if k == 0:
                raise LinkBroken("closed its data link")
            got += k
            self.received += k

    def recv_header(self, timeout: float) -> bytes | None:
        """The next all-reduce's sealed header frame, or None if none starts in ``timeout``."""
        head = memoryview(bytearray(LENGTH.size))
        self.sock.settimeout(timeout)
        try:
            self._fill(head[:1])
        except TimeoutError:
            return None
        finally:
            self.sock.settimeout(None)
        self._fill(head[1:])
        (n,) = LENGTH.unpack(head)
        if not (m.RING_TAG if self.sealed else 0) <= n <= m.RING_MAX_HEADER:
            raise LinkBroken(f"sent a ring header record of {n} bytes")
        sealed = memoryview(bytearray(n))
        self._fill(sealed)
        if self.shared:  # the padding after it (m.RING_SHARED_ALIGN)
            self._fill(memoryview(bytearray(-self.received % m.RING_SHARED_ALIGN)))
        if not self.sealed:
            return bytes(sealed)
        try:
            return self.sealer.aead.decrypt(self.sealer.nonce(), sealed, self.sealer.aad)
        except InvalidTag:
            raise LinkBroken("sent a ring header that failed authentication") from None

    def recv_piece_into(self, dest: memoryview) -> None:
        if not self.sealed:
            self._fill(dest)
            return
        need = len(dest) + m.RING_TAG
        if len(self._buf) < need:
            self._buf = bytearray(need)
        sealed = memoryview(self._buf)[:need]
        self._fill(sealed)
        try:
            self.sealer.aead.decrypt_into(self.sealer.nonce(), sealed, self.sealer.aad, dest)
        except InvalidTag:
            raise LinkBroken("sent ring data that failed authentication") from None

    def wake(self) -> None:
        """Unblock a receive under way (the group failed) without telling the peer."""
        try:
            self.sock.shutdown(socket.SHUT_RD)
        except OSError:
            pass

    def close(self) -> None:
        _close(self.sock)


def _close(sock: socket.socket | shm.SharedPipe) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def dial(
    address: tuple[str, int],
    group_id: int,
    rank: int,
    key: bytes,
    plain_ok: bool = True,
    shared_ok: bool | Callable[[], bool] = True,
) -> DataOut:
    """Connect to the successor's TCP data plane and prove both ends hold ``key``
    (blocking; at most RING_CONNECT_TIMEOUT). On a same-host connection the dialler asks
    for plain records if ``plain_ok``, through a shared-memory segment it offers if
    ``shared_ok`` too (a function is asked only then: it charges the segment's memory, and
    says False if it cannot); the successor's sealed answer decides."""
    sock = socket.create_connection(address, timeout=m.RING_CONNECT_TIMEOUT)
    seg = None
    try:
        _tune(sock)
        out, back = _Sealer(key, TO_SUCCESSOR, group_id), _Sealer(key, TO_DIALLER, group_id)
        ask = PLAIN if plain_ok and same_host(sock) else SEALED
        if ask == PLAIN and (shared_ok() if callable(shared_ok) else shared_ok):
            seg = shm.make_segment()
            ask = SHARED if seg is not None else PLAIN
        hello = out.aead.encrypt(out.nonce(), m.RING_HELLO + ask, out.aad)
        offer = shm.trailer(seg) if seg is not None else b""
        sock.sendall(PREAMBLE.pack(m.RING_MAGIC, group_id, rank) + hello + offer)
        answer = _read_exact(sock, HELLO_RECORD)
        try:
            opened = back.aead.decrypt(back.nonce(), answer, back.aad)
        except InvalidTag:
            opened = b""
        mode = opened[len(m.RING_HELLO) :]
        if opened[: len(m.RING_HELLO)] != m.RING_HELLO or mode not in (PLAIN, SEALED, SHARED):
            raise LinkBroken("the listener there did not prove the link key (not the successor)")
        if mode != SEALED and ask == SEALED or mode == SHARED and ask != SHARED:
            raise LinkBroken(f"the successor answered mode {mode[0]} to mode {ask[0]}")
        sock.settimeout(None)
        if mode == SHARED:
            assert seg is not None
            return DataOut(shm.SharedPipe(sock, seg), out, sealed=False)
        return DataOut(sock, out, sealed=mode == SEALED)
    except BaseException:
        sock.close()
        raise
    finally:
        if seg is not None:  # the successor opened it before answering, or never will
            seg.close_fd()


Lookup = Callable[[int, int], "tuple[bytes, Callable[[DataIn], None]] | str"]
"""(group id, dialler's rank) -> (the link key, where the authenticated DataIn goes), or
why the link is refused."""


RING_PENDING_MAX = 64
"""Data links whose preamble is still arriving, at once; a newer one closes the oldest. A
server has one predecessor per group, so a handful in flight is already many."""
RING_PENDING_PER_HOST = 8
"""Of those, how many one IP address may hold (a newer one closes that address's oldest)."""


class _Preamble:
    """What has arrived of one link's preamble, and what it proved so far."""

    __slots__ = ("buf", "need", "found", "ask")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.need = PREAMBLE.size + HELLO_RECORD
        """Bytes expected in all (grows by the trailer when mode 2 is asked)."""
        self.found: tuple[Callable[[DataIn], None], _Sealer, _Sealer] | None = None
        """The hand-over and both directions' sealers, once the group and rank are known."""
        self.ask = b""


class RingListener(BoundedListener):
    """This server's TCP data-plane listener: one thread that accepts predecessors' data
    links, reads and checks every link's preamble in one selector loop (``_listener``: no
    thread per connection), and hands each authenticated link to its group member.

    Bounded against strangers (the port admits anyone until the hello proves the key): at
    most ``RING_PENDING_MAX`` preambles in flight, ``RING_PENDING_PER_HOST`` from one IP,
    each with one deadline (``m.RING_CONNECT_TIMEOUT``) for the whole preamble however
    slowly it trickles."""

    name = "ring data listener"

    def __init__(
        self, host: str, port: int, lookup: Lookup, plain_ok: bool = True, shared_ok: bool = True
    ) -> None:
        super().__init__(host, port, RING_PENDING_MAX, RING_PENDING_PER_HOST)
        self.lookup = lookup
        self.plain_ok = plain_ok
        """Grant a same-host dialler's ask for plain records (``--ring-seal-loopback``
        turns it off)."""
        self.shared_ok = shared_ok
        """Take a same-host dialler's shared-memory segment (``--ring-loopback-tcp`` turns
        it off: plain records over loopback TCP)."""
        self.start("ring-listener")

    def deadline_s(self) -> float:
        return m.RING_CONNECT_TIMEOUT

    def expired(self, slot: Slot) -> None:
        p: _Preamble = slot.state
        self._refused(slot, f"sent {len(p.buf)} of {p.need} preamble bytes in "
                            f"{m.RING_CONNECT_TIMEOUT:g} s")  # fmt: skip

    def ready(self, slot: Slot, events: int) -> None:
        """Read what has arrived of the preamble; check each part once it is whole."""
        if slot.state is None:
            slot.state = _Preamble()
            _tune(slot.conn)
        p: _Preamble = slot.state
        try:
            chunk = slot.conn.recv(p.need - len(p.buf))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._refused(slot, f"its connection broke: {exc.strerror or exc}")
            return
        if not chunk:
            self._refused(slot, "closed the data link")
            return
        before = len(p.buf)
        p.buf += chunk
        try:
            if before < PREAMBLE.size <= len(p.buf):
                self._check_preamble(p)
            if p.found is not None and len(p.buf) == PREAMBLE.size + HELLO_RECORD and not p.ask:
                self._check_hello(p)
            if p.ask and len(p.buf) == p.need:
                self.release(slot)
                self._finish(slot, p)
        except LinkBroken as exc:
            self._refused(slot, str(exc))

    def _check_preamble(self, p: _Preamble) -> None:
        magic, gid, rank = PREAMBLE.unpack_from(p.buf)
        if magic != m.RING_MAGIC:
            raise LinkBroken("not a ring data link (bad magic)")
        found = self.lookup(gid, rank)
        if isinstance(found, str):
            raise LinkBroken(f"group {gid:016x} rank {rank}: {found}")
        key, deliver = found
        p.found = (deliver, _Sealer(key, TO_SUCCESSOR, gid), _Sealer(key, TO_DIALLER, gid))

    def _check_hello(self, p: _Preamble) -> None:
        assert p.found is not None
        inn = p.found[1]
        _, gid, rank = PREAMBLE.unpack_from(p.buf)
        try:
            ok = inn.aead.decrypt(inn.nonce(), bytes(p.buf[PREAMBLE.size :]), inn.aad)
        except InvalidTag:
            ok = b""
        ask = ok[len(m.RING_HELLO) :]
        if ok[: len(m.RING_HELLO)] != m.RING_HELLO or ask not in (PLAIN, SEALED, SHARED):
            raise LinkBroken(
                f"group {gid:016x} rank {rank}: the dialler did not prove the link key"
            )
        p.ask = ask
        if ask == SHARED:
            p.need += shm.TRAILER.size

    def _finish(self, slot: Slot, p: _Preamble) -> None:
        """The whole preamble is in and proved the key: hand the link over, answer."""
        assert p.found is not None
        deliver, inn, back = p.found
        conn = slot.conn
        try:
            offer = bytes(p.buf[PREAMBLE.size + HELLO_RECORD :])
            plain = p.ask != SEALED and self.plain_ok and same_host(conn)
            mode = PLAIN if plain else SEALED
            end: socket.socket | shm.SharedPipe = conn
            if plain and offer and self.shared_ok:
                seg, why = shm.open_segment(offer)
                if seg is None:
                    log.info(
                        "ring data link from %s: plain TCP, not shared memory: %s",
                        slot.where,
                        why,
                        extra={"event": "ring_link_unshared"},
                    )
                else:
                    end, mode = shm.SharedPipe(conn, seg), SHARED
            conn.settimeout(m.RING_CONNECT_TIMEOUT)  # the answer fits any socket buffer
            # handed over before the answer: the dialler's RingPlane follows the answer
            deliver(DataIn(end, inn, sealed=not plain))
            conn.sendall(back.aead.encrypt(back.nonce(), m.RING_HELLO + mode, back.aad))
            conn.settimeout(None)
        except Exception as exc:  # noqa: BLE001 - one connection's failure, logged
            log.warning(
                "ring data link from %s refused: %s",
                slot.where,
                exc,
                extra={"event": "ring_link_refused"},
            )
            conn.close()

    def _refused(self, slot: Slot, why: str) -> None:
        log.warning(
            "ring data link from %s refused: %s",
            slot.where,
            why,
            extra={"event": "ring_link_refused"},
        )
        self.drop(slot)


__all__ = ["HELLO_RECORD", "LENGTH", "DataIn", "DataOut", "LinkBroken", "RingListener", "dial",
           "same_host"]  # fmt: skip
