"""One client connection driven by threads instead of trio: the same sans-I/O core, another shell.

Why a second shell: a remote device's user thread records ops while holding the GIL. A trio
loop in another thread got the interpreter back only at the 5 ms switch interval, so a step
the user flushed waited there; a loop in another process cost a local hop and a third busy
process per step. Here the caller's thread packetizes and sends in ``send_frame`` itself, and
one reader thread receives, acknowledges and runs QUIC's timer. The reader needs the GIL only
when a datagram arrives or a timer fires, and nothing it does is urgent while the caller is
busy: when the caller waits for a reply it releases the GIL and the reader runs at once.

Frames (4-byte big-endian length, then the payload) are handed to ``on_frame(stream_id,
frame)`` as soon as they are whole, on the reader thread, outside the connection's lock;
``on_frame(stream_id, None)`` says the peer finished the stream. Received bytes count as read
when they reach the frame buffer, so the flow-control window follows this reader, which reads
everything: buffered data is bounded by one partial frame (``max_frame_size``) per stream.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import cast

from aioquic.quic import events

from ..addressing import SocketAddress
from ._auth import AUTH_REFUSED, AuthFailure, PeerAuth
from ._config import EndpointConfig, qh3_part
from ._engine import ClientEngine, ReceiveLedger
from ._errors import FrameTooLarge, PeerGone, PeerRejected, TransportError
from ._framing import FRAME_PREFIX, FrameReader
from ._identity import Identity, PeerId
from ._quic import client_connection
from ._termination import termination_error
from ._udp import SEND_LOSS_ERRNOS, size_buffers

log = logging.getLogger("burn_remote.transport")

FrameHandler = Callable[[int, bytes | None], None]
ClosedHandler = Callable[[TransportError], None]

_INLINE_FRAME = 65536
"""Frames up to this size are joined to their prefix (one copy); larger ones are not copied."""
_RECV_SIZE = 65536
_RECV_BATCH = 256
FINE_WAIT = 0.002
"""The reader waits for timers nearer than this (seconds) with ``select``, whose timeout
has microsecond resolution: with ``poll``'s milliseconds, a packet the QUIC engine paces
by 0.1 ms (qh3 does) would leave ~1 ms late."""
STAND_ASIDE = 0.02
"""Seconds the reader thread leaves the socket alone after a caller drove the connection
itself (``drive_until``): a caller that waits again within this time reads its reply in
its own thread, with no hand-off between threads. Timers run on time meanwhile (the reader
wakes for them), and a sender that waits for room or a second waiting thread calls the
reader back at once; only datagrams nobody waits for may wait this long to be read. Each
time the reader checks costs a thread wake-up: at 2 ms it cost more CPU than the hand-offs
it saves."""
CALLER_POLL_CHECK = 1.0
"""Seconds between the reader's checks while a caller drives the socket. A caller that stops
driving wakes the reader itself, so this is only a safety net: at STAND_ASIDE's 20 ms, a
remote `generate` waiting half a second per block of tokens paid ~50 reader wake-ups a
second, each ~0.1 ms of this process's CPU on a loaded 2-core host (`bench/generate.py`)."""


def _client_quic(
    identity: Identity, config: EndpointConfig, host: str, auth: PeerAuth, ledger: ReceiveLedger
) -> ClientEngine:
    """The sans-I/O connection of the configured engine (qh3 is imported only when used)."""
    if config.quic_engine == "qh3":
        qh3 = qh3_part("_qh3")
        engine: ClientEngine = qh3.qh3_client_connection(identity, config, host, auth.sink, ledger)
        return engine
    return client_connection(identity, config, host, auth.sink, ledger)


class BlockingConnection:
    """An authenticated client connection; ``connect`` returns it after the handshake.

    Thread-safe: any thread may send; frames arrive on the reader thread. Not for servers
    (one peer, a connected socket, no connection-id table): those run on the trio ``Endpoint``.
    """

    def __init__(
        self,
        quic: ClientEngine,
        sock: socket.socket,
        remote: SocketAddress,
        config: EndpointConfig,
        on_frame: FrameHandler,
        on_closed: ClosedHandler,
        auth: PeerAuth,
        ledger: ReceiveLedger,
    ) -> None:
        self._quic = quic
        self._auth = auth
        self._ledger = ledger
        self._sock = sock
        self._remote = remote
        self._config = config
        self._on_frame = on_frame
        self._on_closed = on_closed
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        """Notified after each batch of received datagrams: ACKs free send space."""
        self._waiting = 0
        """Threads waiting on ``_changed`` (a sender for room, ``close`` for ACKs)."""
        self._readers: dict[int, FrameReader] = {}
        self._ready = threading.Event()
        self._error: TransportError | None = None
        self._stopping = False
        self._handed_out = False
        """Set once ``connect`` returned it: only then is ``on_closed`` called."""
        self._armed: float | None = None  # the deadline the reader sleeps towards
        self._timer: float | None = None  # QUIC's timer after the last round or send
        self._next_ping = time.monotonic() + (config.keepalive_interval or float("inf"))
        self._ping_uid = 0
        self._owner: int | None = None
        """The thread reading the socket now (the reader, or a caller in ``drive_until``)."""
        self._aside_until = 0.0
        """The reader leaves the socket to callers until then (``time.monotonic``)."""
        self._aside = threading.Condition(self._lock)
        """The reader waits on it while it stands aside."""
        self._direct_poller: select.poll | None = None
        self._recall = False
        """A thread waits for frames while a caller drives: the reader takes over after it."""
        self._aside_asked = False
        """A caller found the reader on the socket: it stands aside after its round."""
        self._takers = 0
        """Callers waiting for the reader to stand aside (it then leaves timers to them)."""
        self._reader_wakes = 0.0
        """When the reader, standing aside, wakes next (0 while it reads the socket)."""
        self._late = False
        """The reader took the socket back after standing aside (see ``_round``)."""
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self.peer_id: PeerId | None = None
        self.stopped: dict[int, int] = {}
        """Stream id -> the application error code of the peer's STOP_SENDING or RESET_STREAM
        on it: why the peer refused that stream (protocol/README.md section 3, Refusal)."""
        self._thread = threading.Thread(target=self._run, name="burn-remote-quic", daemon=True)

    @classmethod
    def connect(
        cls,
        identity: Identity,
        peer: PeerId | str,
        address: tuple[str, int],
        *,
        on_frame: FrameHandler,
        on_closed: ClosedHandler,
        config: EndpointConfig | None = None,
    ) -> BlockingConnection:
        """Dial ``peer`` at ``address`` and return once both sides accepted each other.

        Raises:
            PeerRejected: the server's key is not ``peer``, or the server refused us.
            TransportError: no answer within ``handshake_timeout``, or another failure.
        """
        config = config or EndpointConfig()
        peer_id = PeerId.parse(peer) if isinstance(peer, str) else peer
        try:
            infos = socket.getaddrinfo(address[0], address[1], type=socket.SOCK_DGRAM)
        except OSError as exc:
            raise TransportError(f"cannot resolve {address[0]!r}: {exc}") from None
        if not infos:
            raise TransportError(f"cannot resolve {address[0]!r}")
        family, _, _, _, sockaddr = infos[0]
        remote = cast(SocketAddress, sockaddr)  # (a DGRAM lookup of a host: an IP address)
        sock = socket.socket(family, socket.SOCK_DGRAM)
        conn = None
        try:
            size_buffers(sock, config.socket_buffer)
            sock.connect(remote)
            auth, ledger = (
                PeerAuth(identity, is_client=True, expected_peer=peer_id),
                ReceiveLedger(),
            )
            quic = _client_quic(identity, config, remote[0], auth, ledger)
            conn = cls(quic, sock, remote, config, on_frame, on_closed, auth, ledger)
            with conn._lock:
                quic.connect(remote, now=time.monotonic())
                conn._transmit()
            conn._thread.start()
        except BaseException as exc:
            sock.close()
            if conn is not None:  # its reader never started: close what it would have
                os.close(conn._wake_r)
                os.close(conn._wake_w)
            if isinstance(exc, OSError):  # e.g. no route to that address
                raise TransportError(f"connection to {address[0]}:{address[1]}: {exc}") from None
            raise
        if not conn._ready.wait(config.handshake_timeout):
            conn._shut(f"no handshake within {config.handshake_timeout:g} s")
            raise TransportError(
                f"connection to {address[0]}:{address[1]}: no handshake within "
                f"{config.handshake_timeout:g} s"
            )
        with conn._lock:
            error = conn._error
            conn._handed_out = error is None
        if error is not None:
            conn._shut("handshake failed")
            raise error
        return conn

    @property
    def is_closed(self) -> bool:
        """True once the connection failed or is being closed: nothing more goes through it;
        `close_reason` says why it ended."""
        return self._error is not None or self._stopping

    @property
    def close_reason(self) -> TransportError | None:
        """Why the connection ended, once it has."""
        return self._error

    # -- sending (any thread) --------------------------------------------------------------

    def open_stream(self) -> int:
        """A new bidirectional stream's id; the peer sees the stream with its first frame."""
        with self._lock:
            self._check_open()
            sid = self._quic.open_bidi_stream()
            self._readers[sid] = FrameReader(self._config.max_frame_size)
            return sid

    def send_frame(
        self,
        stream_id: int,
        data: bytes | bytearray | memoryview,
        *,
        wait: bool = True,
        prefixed: bool = False,
    ) -> None:
        """Send one frame now.

        With ``wait``, waits while the stream holds ``send_buffer`` unacknowledged bytes;
        without, leaves in aioquic's buffer whatever the peer cannot take yet (for small
        frames from a thread that must never block on the network). With ``prefixed``,
        ``data`` already starts with the frame's 4-byte length prefix (written by a sender
        that built the frame with room for it): it goes to QUIC without another copy.

        Raises:
            FrameTooLarge: the frame exceeds ``max_frame_size``.
            TransportError: the connection is closed.
        """
        if prefixed:
            size = len(data) - 4
            if size < 0 or FRAME_PREFIX.unpack_from(data)[0] != size:
                raise ValueError("a prefixed frame must start with its own length")
        else:
            size = len(data)
        if size > self._config.max_frame_size:
            raise FrameTooLarge(f"frame of {size} bytes exceeds {self._config.max_frame_size}")
        if prefixed:
            parts: tuple[bytes | memoryview, ...] = (
                data if type(data) is bytes else memoryview(data),
            )
        elif size <= _INLINE_FRAME:
            parts = (FRAME_PREFIX.pack(size) + data,)
        else:
            parts = (FRAME_PREFIX.pack(size), memoryview(data))
        quic = self._quic
        cap = self._config.send_buffer
        with self._lock:
            for part in parts:
                written, total = 0, len(part)
                while written < total:
                    self._check_open()
                    room = total - written
                    if wait:
                        room = min(room, cap - quic.sender_buffered(stream_id))
                        if room <= 0:
                            if self._owner is None:
                                self._call_reader()  # ACKs free room: someone must read
                            self._waiting += 1
                            try:
                                self._changed.wait()
                            finally:
                                self._waiting -= 1
                            continue
                    try:
                        quic.send_stream_data(stream_id, part[written : written + room])
                    except (RuntimeError, ValueError) as exc:  # the peer stopped or reset it
                        raise TransportError(f"stream {stream_id} is closed: {exc}") from None
                    written += room
                    self._transmit()

    def finish(self, stream_id: int) -> None:
        """End our side of a stream (the peer's side stays open until the peer ends it)."""
        with self._lock:
            self._check_open()
            try:
                self._quic.finish_stream(stream_id)
            except (RuntimeError, ValueError) as exc:  # the peer stopped or reset it
                raise TransportError(f"stream {stream_id} is closed: {exc}") from None
            self._transmit()

    def close(self, reason: str = "", *, flush_timeout: float = 5.0) -> None:
        """Wait (up to ``flush_timeout``) for sent data to be acknowledged, then send
        CONNECTION_CLOSE with ``reason`` and stop the reader."""
        deadline = time.monotonic() + flush_timeout
        with self._lock:
            while self._error is None and self._quic.unacknowledged():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                if self._owner is None:
                    self._call_reader()
                self._waiting += 1
                try:
                    self._changed.wait(left)
                finally:
                    self._waiting -= 1
        self._shut(reason or "closed by peer")

    def drive_until(
        self, done: Callable[[], bool], timeout: float, *, linger: bool = True
    ) -> bool | None:
        """Wait for ``done()`` by reading the socket in this thread, handing frames to
        ``on_frame`` here: a reply then costs no wake-up of the reader thread and no
        hand-off back to this one (two thread switches and a lock round per round trip).

        ``done`` is checked after each batch of frames, without any lock held. Returns
        True once it holds, False after ``timeout`` seconds, and None without waiting when
        another caller drives, the reader keeps the socket (``linger=False``) or the
        connection closed: the caller then waits as before, for ``on_frame`` calls made
        elsewhere. The reader leaves the socket to
        callers for ``STAND_ASIDE`` seconds after each ``drive_until`` (a call that finds it
        on the socket wakes it and waits for it to step aside: one hand-off, after which
        calls drive directly), and takes it back when none came in that time, or a timer is
        due while nobody reads.

        ``linger=False`` is for a caller that expects more frames after this one (pipelined
        requests): it never asks the reader to stand aside, and if it drove (the reader
        stood aside for an earlier caller) it hands the socket back at once, so replies
        that come while nobody waits are read as they arrive."""
        with self._lock:
            if self._error is not None or self._stopping or not self._handed_out:
                return None
            if self._owner is not None:
                if self._owner != self._thread.ident:  # another caller drives: the reader
                    self._recall = True  # must take over when it leaves
                    return None
                if not linger:
                    return None
                # Ask the reader to stand aside now (it may be waiting in poll for this very
                # reply, which it would then read ``STAND_ASIDE`` late), and drive.
                wait_end = time.monotonic() + timeout
                self._takers += 1  # the reader does not take the socket back meanwhile
                try:
                    while self._owner is not None:
                        left = wait_end - time.monotonic()
                        if self._error is not None or self._stopping or left <= 0:
                            return None
                        if self._owner == self._thread.ident:  # (again: it may have taken it
                            self._aside_asked = True  # back for a due timer before we came)
                            self._wake()
                        self._aside.wait(min(left, 0.05))
                finally:
                    self._takers -= 1
                    if self._owner is None:  # we never took it: the reader waits for that
                        self._aside.notify_all()
                if self._error is not None or self._stopping:  # the reader ended meanwhile
                    return None
            self._owner = threading.get_ident()
            if self._direct_poller is None:
                self._direct_poller = select.poll()
                self._direct_poller.register(self._sock, select.POLLIN)
                self._direct_poller.register(self._wake_r, select.POLLIN)
            poller = self._direct_poller
        end = time.monotonic() + timeout
        frames: list[tuple[int, bytes | None]] = []
        try:
            while True:
                self._hand_out(frames)
                if done():
                    return True
                with self._lock:
                    if self._error is not None or self._stopping:
                        return None
                    deadline = min(self._deadline(), end)
                wait = deadline - time.monotonic()
                if wait <= 0 and deadline >= end:
                    return False
                woken = self._poll(poller, wait)
                with self._lock:
                    frames = self._round(woken)
        finally:
            with self._lock:
                self._owner = None
                self._aside_until = time.monotonic() + STAND_ASIDE
                if not linger or self._recall or self._error is not None or self._stopping:
                    self._call_reader()  # for another waiter, or to report the loss
                else:  # the reader, standing aside, waits for the socket to be free
                    self._aside.notify_all()

    def ping(self) -> None:
        """Send a PING now (keep-alive is automatic; this is for tests and tools)."""
        with self._lock:
            self._check_open()
            self._send_ping()

    # -- internals -------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._error is not None:
            raise self._error
        if self._stopping:
            raise TransportError("connection is closed")

    def _shut(self, reason: str) -> None:
        with self._lock:
            if self._error is None and not self._stopping:
                self._quic.close(error_code=0, reason_phrase=reason)
                self._transmit()
            self._stopping = True
            self._wake()
            self._aside.notify_all()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(5.0)

    def _wake(self) -> None:
        """Interrupt the reader's poll (called with the lock held: the pipe may be closed)."""
        if self._wake_w < 0:
            return
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass  # already woken

    def _send_ping(self) -> None:
        self._ping_uid += 1
        self._quic.send_ping(self._ping_uid)
        self._transmit()

    def _transmit(self) -> None:
        """Send what aioquic has ready; wake the reader if QUIC's timer moved earlier."""
        quic = self._quic
        for data, _ in quic.datagrams_to_send(time.monotonic()):
            try:
                self._sock.send(data)
            except OSError as exc:  # ICMP errors from a gone peer surface here
                if exc.errno not in SEND_LOSS_ERRNOS:
                    raise
        timer = self._timer = quic.get_timer()
        if timer is not None and (self._armed is None or timer < self._armed):
            self._armed = timer
            owner = self._owner
            if owner is None:  # nobody polls: the reader, standing aside, if it sleeps longer
                if timer < self._reader_wakes:
                    self._aside.notify()
            elif owner != threading.get_ident():
                self._wake()  # whoever polls the socket

    def _deliveries(self) -> tuple[list[tuple[int, bytes | None]], bool]:
        """Drain aioquic's events (lock held): the frames to hand out, and whether what was
        read owes the peer a window update."""
        quic, ledger = self._quic, self._ledger
        out: list[tuple[int, bytes | None]] = []
        window_due = False
        while (event := quic.next_event()) is not None:
            if isinstance(event, events.StreamDataReceived):
                sid = event.stream_id
                if sid == self._auth.peer_stream or not self._auth.done:
                    self._feed_auth(event)
                    continue
                reader = self._readers.get(sid)
                if reader is None:
                    if (sid & 1) == 0:  # ours, already finished: a late frame
                        continue
                    reader = self._readers[sid] = FrameReader(self._config.max_frame_size)
                ledger.consumed[sid] = ledger.consumed.get(sid, 0) + len(event.data)
                window_due = window_due or quic.window_update_due(sid)
                try:
                    out.extend((sid, f) for f in reader.feed(event.data))
                except FrameTooLarge:
                    quic.stop_stream(sid, 1)
                    self._readers.pop(sid)
                    continue
                if event.end_stream:  # inside a frame or not, the stream is over
                    out.append((sid, None))
                    self._readers.pop(sid)
                    ledger.forget(sid)
                    if sid & 1:  # the peer's stream: end ours too, so aioquic frees it
                        quic.finish_stream(sid)
            elif isinstance(event, (events.StreamReset, events.StopSendingReceived)):
                self.stopped[event.stream_id] = event.error_code
                if self._readers.pop(event.stream_id, None) is not None:
                    out.append((event.stream_id, None))
            elif isinstance(event, events.ConnectionTerminated) and self._error is None:
                host, port = self._remote[:2]
                self._error = termination_error(event, f"connection to {host}:{port}")
        if not self._ready.is_set():
            proof = None if self._error is not None else self._auth.proof_due()
            if proof is not None:  # the handshake has its keys: the binding is known
                quic.send_stream_data(self._auth.our_stream, proof, end_stream=True)
                self._transmit()
            if self._error is not None or (quic.handshake_confirmed and self._auth.done):
                self.peer_id = self._auth.peer_id
                self._ready.set()
        if self._waiting:  # (a Condition's notify is Python-level work even for nobody)
            self._changed.notify_all()
        return out, window_due

    def _feed_auth(self, event: events.StreamDataReceived) -> None:
        """The server's key proof (lock held); anything else before it is refused: a server
        of ours sends nothing before the client's first request."""
        try:
            if event.stream_id != self._auth.peer_stream:
                raise AuthFailure("the server sent application data before its key proof")
            self._auth.feed(event.data, event.end_stream)
        except AuthFailure as exc:
            if self._error is None:
                self._quic.close(error_code=AUTH_REFUSED, reason_phrase=str(exc))
                self._transmit()
                host, port = self._remote[:2]
                self._error = PeerRejected(f"connection to {host}:{port}: {exc}")

    def _run(self) -> None:
        """The reader thread: datagrams in, events out, the timer and the keep-alive.

        Each round ends by handing out frames and goes straight back to ``poll``: the thread
        a frame wakes gets the GIL at once. The next deadline is taken before the hand-out;
        a send from a handler that moves QUIC's timer earlier writes the wake-up pipe."""
        poller = select.poll()
        poller.register(self._sock, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        frames: list[tuple[int, bytes | None]] = []
        me = threading.get_ident()
        try:
            with self._lock:
                self._owner = me
                deadline = self._deadline()
            while True:
                self._hand_out(frames)
                if self._error is not None or self._stopping:
                    break
                if self._aside_asked or self._aside_until > time.monotonic():
                    with self._lock:
                        if self._aside_asked:
                            self._aside_asked = False
                            self._aside_until = time.monotonic() + STAND_ASIDE
                        if not self._stand_aside(me):
                            break
                        deadline = self._deadline()
                woken = self._poll(poller, deadline - time.monotonic())
                with self._lock:
                    frames = self._round(woken)
                    deadline = self._deadline()
        finally:
            with self._lock:
                if self._owner == me:
                    self._owner = None
                while self._owner is not None:  # a caller still reads the socket
                    self._aside.wait(0.05)
                if self._error is None:
                    self._error = TransportError("connection closed")
                error, tell = self._error, self._handed_out and not self._stopping
                self._ready.set()
                self._changed.notify_all()
                self._sock.close()
                os.close(self._wake_r)
                os.close(self._wake_w)
                self._wake_w = -1
            if tell:
                self._on_closed(error)

    def _call_reader(self) -> None:
        """Make the reader take the socket back now (lock held): someone waits for
        datagrams and will not read them itself."""
        self._recall = self._aside_asked = False
        self._aside_until = 0.0
        self._aside.notify_all()

    def _stand_aside(self, me: int) -> bool:
        """Leave the socket to callers (lock held) until none drove the connection for
        ``STAND_ASIDE`` seconds, or a timer is due while nobody reads it; False when the
        connection ended meanwhile."""
        self._owner = None
        self._aside.notify_all()  # a caller may wait for the socket
        while self._error is None and not self._stopping:
            now = time.monotonic()
            if self._owner is None and not self._takers:
                due = min(self._aside_until, self._deadline())
                if now >= due:
                    self._owner = me
                    self._reader_wakes = 0.0
                    self._late = True  # what waits in the socket may be STAND_ASIDE old
                    return True
                self._reader_wakes = due
                self._aside.wait(due - now)
            else:  # a caller polls (or is about to), and runs the timers meanwhile; it
                # wakes this thread when it lets go of the socket
                self._reader_wakes = now + CALLER_POLL_CHECK
                self._aside.wait(CALLER_POLL_CHECK)
        return False

    def _poll(self, poller: select.poll, wait: float) -> bool:
        """Wait up to ``wait`` seconds for a datagram or a wake-up; whether woken."""
        if wait < FINE_WAIT:  # select's timeout has microseconds, poll's milliseconds
            watched = (self._sock.fileno(), self._wake_r)
            return self._wake_r in select.select(watched, (), (), max(0.0, wait))[0]
        timeout = None if wait == float("inf") else int(wait * 1000) + 1
        return any(fd == self._wake_r for fd, _ in poller.poll(timeout))

    def _hand_out(self, frames: list[tuple[int, bytes | None]]) -> None:
        """Frames to ``on_frame``, in order, by the thread that read them (no lock held)."""
        for sid, frame in frames:
            try:
                self._on_frame(sid, frame)
            except Exception:  # the handler's bug, not the connection's
                log.exception("frame handler failed on stream %d", sid)

    def _round(self, woken: bool) -> list[tuple[int, bytes | None]]:
        """Read what arrived, run due timers, send what is due; the frames to hand out."""
        quic, sock = self._quic, self._sock
        if woken:
            os.read(self._wake_r, 4096)
        for _ in range(_RECV_BATCH):
            try:
                data = sock.recv(_RECV_SIZE, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            except ConnectionRefusedError:  # ICMP port unreachable: nothing listens there
                if self._error is None:
                    host, port = self._remote[:2]
                    self._error = PeerGone(
                        f"connection to {host}:{port} refused: nothing listens there "
                        "(the server is not running)"
                    )
                break
            except OSError:  # another ICMP error from the peer's host: QUIC copes
                continue
            quic.receive_datagram(data, self._remote, time.monotonic())
        now = time.monotonic()
        if self._late:  # read after standing aside: acknowledge now, not ACK_DELAY later
            self._late = False
            quic.ack_now(now)
        timer = self._timer = quic.get_timer()  # a send below (_transmit) updates it
        fired = timer is not None and now >= timer
        if fired:
            quic.handle_timer(now)  # may queue a probe, which only a build sends
        interval = self._config.keepalive_interval
        if interval is not None and now >= self._next_ping:
            self._next_ping = now + interval
            if quic.handshake_confirmed:
                self._send_ping()
        frames, window_due = self._deliveries()
        if quic.close_pending or (
            self._error is None and (fired or window_due or quic.send_due_at(now, self._timer))
        ):
            self._transmit()
        return frames

    def _deadline(self) -> float:
        """When the reader must wake without a datagram: QUIC's timer (as the last round or
        send left it: aioquic's ``get_timer`` is not free) or the next PING."""
        timer = self._armed = self._timer
        return self._next_ping if timer is None else min(timer, self._next_ping)


__all__ = ["BlockingConnection"]
