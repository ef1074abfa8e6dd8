"""The I/O half of a remote device: one QUIC connection, driven by this process's threads.

The user's thread sends. ``kick()`` takes what the protocol has pending, numbers it for
resume (``_remote_resume``) and writes it to the connection, so a flushed step is on the wire
when ``flush()`` returns; it never waits on the network (tensors above the bulk threshold go
to a bulk thread, which may wait for the server to take them). Bulk transfers both ways move
in acknowledged chunks (``protocol.bulk``): a read-back is written into its array as it
arrives, and after a lost link each unfinished transfer continues from its last
acknowledged offset. The connection's reader
thread applies the server's frames under ``cond``'s lock and wakes waiters. Dialling, and
after a lost connection dialling again and resuming the session, runs on a connector thread;
batches recorded meanwhile wait in the sequencer and leave when it is done.

Why not an event loop: QUIC here is Python (aioquic), and a loop thread sharing the GIL with
a thread that records ops got the interpreter only at the 5 ms switch interval, so steps left
in bursts at the next read; a loop in a process of its own cost a local hop per message and a
third busy process per step (see ``protocol.transport._blocking``).
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

from burn_remote.protocol import messages as m
from burn_remote.protocol.bulk import BulkReceive, BulkSend, parse_header
from burn_remote.protocol.transport import (  # imported with the first RemoteDevice
    BlockingConnection,
    EndpointConfig,
    Identity,
    PeerGone,
    PeerRejected,
    TransportError,
    default_key_path,
)

from ._remote_protocol import ClientProtocol
from ._remote_resume import (
    ATTEMPT_TIMEOUT,
    RESUME_TIMEOUT,
    STAMP_ROOM,
    ClientSequencer,
    SessionExpired,
)

CLOSE_TIMEOUT = 10.0
"""Seconds ``close`` waits for the connection (and queued uploads) before giving up."""
CONNECT_TIMEOUT = 30.0
"""Seconds the first dial may take before the device fails."""
IDLE_TIMEOUT = float(os.environ.get("BURN_REMOTE_IDLE_TIMEOUT", "30"))
"""Seconds without a packet from the server after which the connection is given up (QUIC's
idle timeout; the smaller of this and the server's ``--idle-timeout`` applies). Keep-alives
every third of it keep a quiet but live connection open."""
QUIC_ENGINE = os.environ.get("BURN_REMOTE_QUIC_ENGINE", "aioquic")
"""The QUIC implementation of this process's remote devices: ``aioquic`` (the default) or
``qh3`` (compiled, less CPU per packet; ``pip install 'burn-remote[qh3]'``)."""
RETRY_PAUSE = 0.25
"""Seconds between dials while resuming."""
WELCOME_WAIT = 30.0
"""Seconds the bulk thread waits for the server's Welcome (its limits size the chunks)."""
GRACE_MARGIN = 5.0
"""Seconds past the server's announced resume grace the link keeps trying before it says
the session expired (the server counts its grace from when it noticed the loss)."""
DIRECT_WAIT = os.environ.get("BURN_REMOTE_DIRECT_WAIT", "1") != "0"
"""A thread that waits for a reply reads it from the socket itself (``Link.wait``); 0 leaves
every read to the connection's reader thread (for A/B measurements)."""
MAX_DONE = 4096
"""Finished incoming transfer ids remembered (to re-acknowledge one resent after a loss)."""

_PID = [os.getpid()]
"""This process's id, updated in a forked child (``os.register_at_fork``)."""
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))

_IDLE, _CONNECTING, _RESUMING, _UP, _CLOSED = "idle", "connecting", "resuming", "up", "closed"


class Link:
    """The connection of one remote device and the threads that serve it."""

    def __init__(
        self,
        peer_id: str,
        address: tuple[str, int],
        protocol: ClientProtocol,
        cond: threading.Condition,
        key_path: str | Path | None = None,
    ) -> None:
        self.peer_id = peer_id
        self.address = address
        self.protocol = protocol
        self.cond = cond
        self.key_path = key_path
        self._lock = threading.Lock()
        """Orders frames on the wire and guards the state below; held for CPU work only."""
        self._state = _IDLE
        self._changed = threading.Condition(self._lock)
        self._conn: BlockingConnection | None = None  # set while _UP or _RESUMING
        self._control = -1
        self._seq = ClientSequencer()
        self._token: bytes | None = None
        self._out: dict[int, BulkSend] = {}
        """Transfers to the server not yet wholly acknowledged (bulk id -> transfer)."""
        self._out_streams: dict[int, BulkSend] = {}  # our bulk stream -> its transfer
        self._in_streams: dict[int, BulkReceive | None] = {}  # server's stream -> transfer
        self._rx: dict[int, BulkReceive] = {}
        """Transfers from the server under way (kept across a resume)."""
        self._rx_done: set[int] = set()
        self._bulk: queue.SimpleQueue[tuple[Any, BulkSend] | None] = queue.SimpleQueue()
        self._bulk_thread: threading.Thread | None = None
        self._pid = _PID[0]
        self._lost: str | None = None
        """How the last connection ended (for the message if resuming fails)."""

    # --- the user's side ----------------------------------------------------------------------
    def kick(self) -> None:
        """Send everything pending (or queue it while dialling); never waits for the server."""
        if self._forked():
            return
        proto = self.protocol
        with self._lock:
            if self._state == _IDLE:
                self._state = _CONNECTING
                self._spawn(self._dial, False)
            while True:
                with self.cond:
                    if proto.fatal is not None:
                        return
                    batch = proto.take(STAMP_ROOM)
                if batch is None:
                    return
                # prefix and sequencing header written into the frame's buffer: the frame
                # is copied once (into QUIC's send buffer) after it was joined
                buffer = batch.frame
                assert isinstance(buffer, bytearray)  # take(STAMP_ROOM): room in a bytearray
                self._seq.stamp(buffer)
                sends = (
                    [BulkSend(bid, payload) for bid, payload in batch.bulk] if batch.bulk else ()
                )
                if sends:
                    self._out.update((send.bulk_id, send) for send in sends)
                if self._state == _UP:
                    self._send(buffer, sends, prefixed=True)
                if not proto.pending:  # (what another thread queued meanwhile goes too)
                    return

    def wait(self, done: Any, timeout: float, linger: bool = True) -> float:
        """Wait for ``done()`` reading the server's frames in this thread, when the link is
        up and no other thread reads them (``BlockingConnection.drive_until``; ``linger``
        False when more replies will follow, see there); the seconds of ``timeout`` left,
        for the caller's own wait on ``cond`` (which returns at once when ``done()`` already
        holds)."""
        conn = self._conn
        if conn is None or self._state != _UP or not DIRECT_WAIT or self._forked() or done():
            return timeout  # (a forked child must not touch its parent's socket or locks)
        start = time.monotonic()
        conn.drive_until(done, timeout, linger=linger)
        return max(0.0, timeout - (time.monotonic() - start))

    def close(self) -> None:
        """Send what is pending and the goodbye (the server frees the session at once)."""
        if self._forked():
            return
        with self._lock:
            if self._state == _IDLE:
                self._state = _CLOSED
                return
        self.kick()
        deadline = time.monotonic() + CLOSE_TIMEOUT
        with self._lock:  # a fatal error does not notify: poll for it
            while self._state not in (_UP, _CLOSED) and self.protocol.fatal is None:
                if time.monotonic() > deadline:
                    break
                self._changed.wait(0.05)
        if self._bulk_thread is not None:
            self._bulk.put(None)
            self._bulk_thread.join(CLOSE_TIMEOUT)
        self._goodbye()

    def _goodbye(self) -> None:
        if self._forked():  # a forked child inherits atexit: the session is its parent's
            return
        with self._lock:
            conn, up = self._conn, self._state == _UP
            self._state = _CLOSED
            if up and conn is not None:
                _control_frame(conn, self._control, self._seq.goodbye())
        if conn is not None:
            conn.close("client closing", flush_timeout=2.0)
        atexit.unregister(self._goodbye)

    def _forked(self) -> bool:
        """In a forked child the connection is its parent's (same keys, same packet numbers)
        and its threads did not come along: the device fails there instead of corrupting the
        parent's session. No lock is taken: a thread may have held one at the fork."""
        if _PID[0] == self._pid:  # (kept by a fork hook: no getpid() per send and wait)
            return False
        if self.protocol.fatal is None:
            self.protocol.fatal = (
                "this RemoteDevice belongs to the process that created it (this one is a "
                "fork of it): create a RemoteDevice in this process instead"
            )
        return True

    # --- sending (with self._lock held) -------------------------------------------------------
    def _send(self, frame: Any, sends: Any, prefixed: bool = False) -> None:
        """A lost connection is reported by its reader; what failed here is resent on resume.
        ``prefixed``: ``frame`` starts with its transport length prefix (``stamp``)."""
        conn = self._conn
        if conn is not None and _control_frame(conn, self._control, frame, prefixed):
            for send in sends:
                self._bulk_put((conn, send))

    def _bulk_put(self, item: tuple[Any, BulkSend]) -> None:
        if self._bulk_thread is None:
            self._bulk_thread = self._spawn(self._send_bulk_loop)
        self._bulk.put(item)

    def _send_bulk_loop(self) -> None:
        """Transfers in order, each on a stream of its own (see ``_send_transfer``)."""
        while (item := self._bulk.get()) is not None:
            self._send_transfer(*item)
            item = None  # the transfer's bytes are freed as soon as the server has them all

    def _send_transfer(self, conn: BlockingConnection, send: BulkSend) -> None:
        """A ``Bulk`` header, then chunks from the last offset the server acknowledged; the
        reader thread ends the stream at the final BulkAck."""
        if send.done or self._out.get(send.bulk_id) is not send:
            return
        send.chunk = self._bulk_chunk()
        if send.acked:
            with self.cond:
                self.protocol.counters.bulk_resumed += 1
        try:
            sid = conn.open_stream()
            self._out_streams[sid] = send
            conn.send_frame(sid, send.header())
            for chunk in send.chunks():
                if send.done:
                    break
                conn.send_frame(sid, chunk)
        except TransportError:
            pass  # the connection is gone: resume continues the transfer

    def _bulk_chunk(self) -> int:
        """Chunk size for the server: what its Welcome announced (waits for it)."""
        with self.cond:
            self.cond.wait_for(
                lambda: self.protocol.welcome is not None or self.protocol.fatal is not None,
                WELCOME_WAIT,
            )
            welcome = self.protocol.welcome
        limits = welcome.limits if welcome is not None else {}
        return min(m.BULK_CHUNK, limits.get("bulk_chunk", m.BULK_CHUNK))

    # --- connecting ---------------------------------------------------------------------------
    def _spawn(self, target: Any, *args: Any) -> threading.Thread:
        thread = threading.Thread(
            target=target, args=args, name=f"burn-remote-{self.peer_id[:8]}", daemon=True
        )
        thread.start()
        return thread

    def _dial(self, resuming: bool) -> None:
        """Connect (again, until RESUME_TIMEOUT, when resuming), then send what waited."""
        timeout = ATTEMPT_TIMEOUT if resuming else CONNECT_TIMEOUT
        started = time.monotonic()
        window = self._resume_window()
        try:
            config = EndpointConfig(
                max_frame_size=m.MAX_FRAME,
                handshake_timeout=timeout,
                idle_timeout=IDLE_TIMEOUT,
                keepalive_interval=max(0.2, IDLE_TIMEOUT / 3),
                quic_engine=QUIC_ENGINE,
            )
            identity = Identity.load_or_create(self.key_path or default_key_path())
            while True:
                try:
                    conn = BlockingConnection.connect(
                        identity,
                        self.peer_id,
                        self.address,
                        config=config,
                        on_frame=self._on_frame,
                        on_closed=self._on_closed,
                    )
                    break
                except TransportError as exc:
                    if not resuming or isinstance(exc, PeerRejected | PeerGone):
                        raise
                    if time.monotonic() - started > window:
                        raise
                    time.sleep(RETRY_PAUSE)
        except Exception as exc:  # the user's next wait raises it
            self._fail(self._dial_failure(exc, resuming, time.monotonic() - started))
            return
        with self._lock:
            if self._state == _CLOSED:
                conn.close("client closing", flush_timeout=0)
                return
            self._conn, self._control = conn, conn.open_stream()
            self._out_streams.clear()
            self._in_streams.clear()
            if resuming:
                assert self._token is not None
                self._state = _RESUMING
                resume = self._seq.resume_frame(self._token)
                _control_frame(conn, self._control, resume)
            else:
                self._go_up([frame for _, frame in self._seq.unacked])
                # A program that ends without close() still says goodbye: the server frees
                # the session now instead of after its idle timeout and resume grace.
                atexit.register(self._goodbye)

    def _where(self) -> str:
        host, port = self.address
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return f"the server {self.peer_id[:12]}... at {shown}"

    def _dial_failure(self, exc: Exception, resuming: bool, tried: float) -> str:
        """What the user's next call raises: what happened, for how long, what to do."""
        if not resuming:
            return f"cannot connect to {self._where()}: {_describe(exc)}"
        lost = self._lost or "the connection was lost"
        again = f"create a new RemoteDevice('{self.peer_id}@...') once it runs again"
        if isinstance(exc, PeerGone):
            if "nothing listens" not in lost:
                lost += "; nothing listens there now"
            return f"{self._where()} is gone ({lost}): its session is lost; {again}"
        return (
            f"{self._where()} stopped answering ({lost}); reconnecting failed for "
            f"{tried:.0f} s (the server keeps a session {self._resume_window() - GRACE_MARGIN:g} s "
            f"after a loss; BURN_REMOTE_RESUME_TIMEOUT {RESUME_TIMEOUT:g} s): session expired, "
            f"its tensors are lost and no transfer under way was stored: {_describe(exc)}"
        )

    def _go_up(self, frames: list[bytes | memoryview]) -> None:
        """Send the frames the server lacks, then every unfinished transfer (from where the
        server's acknowledgements left it)."""
        for frame in frames:
            self._send(frame, [])
        if self._conn is not None:
            for send in self._out.values():
                self._bulk_put((self._conn, send))
        self._state = _UP
        self._changed.notify_all()

    def _resume_window(self) -> float:
        """Seconds to keep dialling after a loss: RESUME_TIMEOUT, or less when the server
        said it keeps the session for a shorter grace (trying longer cannot help)."""
        welcome = self.protocol.welcome
        grace = welcome.limits.get("resume_grace_ms", 0) / 1000 if welcome is not None else 0
        return RESUME_TIMEOUT if grace <= 0 else min(RESUME_TIMEOUT, grace + GRACE_MARGIN)

    # --- the server's side (the connection's reader thread) -----------------------------------
    def _on_frame(self, stream_id: int, frame: bytes | None) -> None:
        try:
            if stream_id == self._control:
                self._on_control(frame)
            else:
                self._on_bulk_stream(stream_id, frame)
        except Exception as exc:  # a bug must end the device visibly, not the reader silently
            self._fail(f"the link failed: {_describe(exc)}")

    def _on_control(self, frame: bytes | None) -> None:
        if frame is None:
            if self._state != _CLOSED:
                self._fail("the server closed the session")
            return
        with self._lock:
            if self._state == _RESUMING:
                self._resumed(frame)
                return
            inner = self._seq.accept(frame)
            if inner is not None and self._token is None:
                self._token = _welcome_token(inner)
        if inner is None:  # a frame resent after a reconnect, applied already
            return
        with self.cond:
            self.protocol.receive_control(inner)
            self.cond.notify_all()
            again = self.protocol.take_resend()
        if again:  # a replay after UNKNOWN_GRAPH (steps the user queued leave with the user's
            self.kick()  # thread's next batch: sending them from here split them into packets)

    def _resumed(self, reply: bytes) -> None:
        """The server's answer to our resume (lock held): resend what it lacks, or fail."""
        try:
            frames = self._seq.resumed(reply)
        except SessionExpired as exc:
            self._state = _CLOSED
            self._fail(
                f"{self._where()} no longer has this session ({exc}): it restarted, or the "
                f"connection was down longer than its resume grace; create a new "
                f"RemoteDevice for it (tensors of this one are lost)"
            )
            return
        self._go_up(frames)

    def _on_bulk_stream(self, stream_id: int, frame: bytes | None) -> None:
        """Our streams carry BulkAcks for our transfers; the server's carry its transfers (a
        ``Bulk`` header, then chunks written into the destination array as they come)."""
        if stream_id & 1 == 0:
            self._on_ack(stream_id, frame)
            return
        if frame is None:
            self._in_streams.pop(stream_id, None)
            return
        conn = self._conn
        if stream_id not in self._in_streams:
            self._in_streams[stream_id], reply = self._open_incoming(frame)
            if reply is not None:
                _bulk_reply(conn, stream_id, reply)
            return
        rx = self._in_streams[stream_id]
        if rx is None:
            return
        ack = rx.feed(frame)
        if rx.done:
            self._in_streams[stream_id] = None
            self._rx.pop(rx.bulk_id, None)
            if len(self._rx_done) >= MAX_DONE:
                self._rx_done = set(sorted(self._rx_done)[MAX_DONE // 2 :])
            self._rx_done.add(rx.bulk_id)
            with self.cond:
                self.protocol.receive_bulk(rx.bulk_id, rx.buffer)
                self.cond.notify_all()
        if ack is not None:
            _bulk_reply(conn, stream_id, ack)

    def _open_incoming(self, frame: bytes) -> tuple[BulkReceive | None, bytes | None]:
        """The transfer a server stream's header opens (new or resumed) and a BulkAck to send
        at once: (None, final ack) for a transfer already whole whose final ack was lost."""
        header = parse_header(frame)
        if header.bulk_id in self._rx_done:
            return None, m.encode(m.BulkAck(header.bulk_id, header.size))
        rx = self._rx.get(header.bulk_id)
        if rx is None:
            rx = self._rx[header.bulk_id] = BulkReceive(header.bulk_id, header.size)
        return rx, rx.start(header)

    def _on_ack(self, stream_id: int, frame: bytes | None) -> None:
        """A BulkAck on one of our transfers; the final one ends the transfer and its stream.
        The server ending the stream first means it refused the transfer (its Upload fails
        with the reason): the transfer is dropped, not resent."""
        send = self._out_streams.get(stream_id)
        if send is None:
            return
        if frame is None or send.on_ack(frame):
            self._out_streams.pop(stream_id, None)
            with self._lock:
                self._out.pop(send.bulk_id, None)
                conn = self._conn
            if frame is not None and conn is not None:
                try:
                    conn.finish(stream_id)
                except TransportError:
                    pass

    def _on_closed(self, error: Exception) -> None:
        """The connection died under us: resume on a new one, or fail the device."""
        with self._lock:
            if self._state == _CLOSED:
                return
            self._conn, self._control = None, -1
            self._lost = _loss(error)
            if self._token is None:
                self._state = _CLOSED
            else:
                self._state = _CONNECTING
                self._spawn(self._dial, True)
                return
        self._fail(f"the connection to {self._where()} is closed: {_describe(error)}")

    def _fail(self, why: str) -> None:
        with self.cond:
            if self.protocol.fatal is None:
                self.protocol.fatal = why
            self.cond.notify_all()


def _welcome_token(frame: bytes) -> bytes | None:
    """The resume token if ``frame`` holds the server's Welcome (its first frame does)."""
    try:
        msgs = m.decode(frame)
    except m.DecodeError:
        return None
    return next((w.resume_token for w in msgs if isinstance(w, m.Welcome)), None)


def _control_frame(
    conn: BlockingConnection, control: int, frame: Any, prefixed: bool = False
) -> bool:
    """Send on the control stream without waiting; False if the connection is gone (its
    reader reports the loss, and resume sends the frame again)."""
    try:
        conn.send_frame(control, frame, wait=False, prefixed=prefixed)
    except TransportError:
        return False
    return True


def _loss(error: Exception) -> str:
    text = _describe(error)
    if "idle timeout" in text.lower():
        return f"no packet from it for the idle timeout (BURN_REMOTE_IDLE_TIMEOUT {IDLE_TIMEOUT:g} s, or the server's --idle-timeout if shorter)"
    return text


def _bulk_reply(conn: BlockingConnection | None, stream_id: int, frame: bytes) -> None:
    """A BulkAck on a server's bulk stream; a lost connection is reported by its reader."""
    if conn is None:
        return
    try:
        conn.send_frame(stream_id, frame, wait=False)
    except TransportError:
        pass


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


__all__ = ["Link"]
