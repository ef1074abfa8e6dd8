"""The QUIC half of a remote device, in a process of its own: ``python -m
burn_remote._link_process FD PEER HOST PORT [KEY]``, started by ``_remote_link.Link``.

Why a process and not a thread: QUIC here is Python (aioquic), and a link thread sharing the
GIL with a user thread that records ops got the interpreter back only after the 5 ms switch
interval for each of its socket calls, so steps left in bursts at the next read and the
server idled while the user recorded. In its own process the link sends each step as it is
flushed, and the user's thread pays one local socket write per step.

The process reads batches (see ``_link_records``) from socket FD, numbers them for resume
(``_remote_resume``), sends them on the connection, and writes the server's frames back.
It ends after a CLOSE record or at end of stream (the user's process is gone): either way it
says goodbye, so the server frees the session at once. A lost connection is resumed.
"""

from __future__ import annotations

import signal
import socket
import sys
from collections import deque
from typing import Any

import trio
from burn_remote.protocol import messages as m

from . import _link_records as r
from ._remote_resume import (
    ATTEMPT_TIMEOUT,
    RESUME_TIMEOUT,
    ClientSequencer,
    SequencedStream,
    SessionExpired,
)

CONNECT_TIMEOUT = 30.0
"""Seconds to wait for the connection before failing the first request."""
PIPE_READ_SIZE = 64 * 1024
"""Bytes asked of the local socket per read: under malloc's mmap threshold, so the buffer
of each read is cheap (1 MiB reads cost ~50 us each in mmap and page faults)."""


class LinkProcess:
    """Owns the endpoint and the connection of one remote device."""

    def __init__(
        self, pipe: socket.socket, peer_id: str, address: tuple[str, int], key_path: str | None
    ) -> None:
        self.peer_id, self.address, self.key_path = peer_id, address, key_path
        self._pipe_sock = pipe
        self._batches: deque[tuple[bytes, int, list[tuple[int, bytes]]]] = deque()
        """(control frame, bulk count, bulk payloads read so far), oldest first."""
        self._resume_token: bytes | None = None
        self._wake = trio.Event()
        self._stop = trio.Event()
        self._out_lock = trio.Lock()
        self._seq = ClientSequencer()

    async def run(self) -> None:
        self._pipe = trio.SocketStream(trio.socket.from_stdlib_socket(self._pipe_sock))
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read_pipe)
                await self._connect_and_serve()
                nursery.cancel_scope.cancel()
        except BaseException as exc:  # the user's next wait raises it
            why = _describe(exc)
            await self._fatal(f"connection to {self.peer_id[:12]}... failed: {why}")
            return
        await self._fatal("the connection is closed")

    # --- the user's side ----------------------------------------------------------------------
    async def _write(self, kind: int, arg: int = 0, payload: bytes = b"") -> None:
        async with self._out_lock:
            for part in r.record_parts(kind, arg, payload):
                await self._pipe.send_all(part)

    async def _fatal(self, why: str) -> None:
        try:
            with trio.move_on_after(2):
                await self._write(r.FATAL, 0, why.encode())
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the user's process is gone: nobody to tell

    async def _read_pipe(self) -> None:
        """Queue the user's batches; CLOSE or end of stream stops the link (after sending)."""
        buf = bytearray()

        async def take(n: int) -> bytes | None:
            while len(buf) < n:
                chunk = await self._pipe.receive_some(PIPE_READ_SIZE)
                if not chunk:
                    return None
                buf.extend(chunk)
            with memoryview(buf) as view:
                out = bytes(view[:n])  # one copy, not two
            del buf[:n]
            return out

        while True:
            header = await take(r.HEADER.size)
            if header is None:
                break
            kind, arg, size = r.HEADER.unpack(header)
            payload = await take(size)
            if payload is None or kind == r.CLOSE:
                break
            if kind == r.BATCH:
                self._batches.append((payload, arg, []))
            elif kind == r.BULK and self._batches:
                self._batches[-1][2].append((arg, payload))
            if self._batches and _complete(self._batches[-1]):
                self._wake.set()
        self._stop.set()
        self._wake.set()

    # --- the server's side ----------------------------------------------------------------------
    async def _connect_and_serve(self) -> None:
        from burn_remote.protocol.transport import (
            Endpoint,
            EndpointConfig,
            Identity,
            TransportError,
            default_key_path,
        )

        identity = Identity.load_or_create(self.key_path or default_key_path())
        bind = ("::", 0) if ":" in self.address[0] else ("0.0.0.0", 0)
        config = EndpointConfig(max_frame_size=m.MAX_FRAME)
        async with Endpoint.open(identity, bind=bind, config=config) as ep:
            with trio.fail_after(CONNECT_TIMEOUT):
                conn = await ep.connect(self.peer_id, self.address)
            resuming = False
            while True:  # one round per connection; a lost one is resumed (see _remote_resume)
                lost = False
                try:
                    await self._session(conn, resuming)
                except* TransportError:
                    lost = not self._stop.is_set()
                if not lost:
                    break
                if not self._resume_token:
                    raise TransportError("connection lost before the session was established")
                conn = await self._reconnect(ep)
                resuming = True
            await conn.close("client closing", flush_timeout=2.0)

    async def _session(self, conn: Any, resuming: bool) -> None:
        """Run the loops on one connection (after resuming the session, on a new one)."""
        seq = self._seq
        control = SequencedStream(await conn.open_stream(), seq)
        async with trio.open_nursery() as nursery:
            if resuming:
                assert self._resume_token is not None
                await control.send_frame(seq.resume_frame(self._resume_token))
                try:
                    frames = await seq.resume(control.stream)
                except SessionExpired as exc:
                    await self._fatal(f"session expired: {exc}")
                    raise
                for frame, bulk in frames:
                    await control.send_frame(frame)
                    for bulk_id, payload in bulk:
                        nursery.start_soon(self._send_bulk, conn, bulk_id, payload)
            nursery.start_soon(self._send_loop, conn, control, nursery)
            nursery.start_soon(self._receive_loop, control)
            nursery.start_soon(self._accept_bulk, conn, nursery)
            await self._stop.wait()
            await self._send_pending(conn, control, nursery)
            await control.send_frame(seq.goodbye())
            nursery.cancel_scope.cancel()

    async def _reconnect(self, ep: Any) -> Any:
        """Dial again until the server answers or RESUME_TIMEOUT passes."""
        from burn_remote.protocol.transport import TransportError

        deadline = trio.current_time() + RESUME_TIMEOUT
        while True:
            try:
                with trio.fail_after(ATTEMPT_TIMEOUT):
                    return await ep.connect(self.peer_id, self.address)
            except (TransportError, trio.TooSlowError):
                if trio.current_time() > deadline:
                    raise
                await trio.sleep(0.25)

    async def _send_loop(self, conn: Any, control: Any, nursery: trio.Nursery) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            await self._send_pending(conn, control, nursery)

    async def _send_pending(self, conn: Any, control: Any, nursery: trio.Nursery) -> None:
        while self._batches and _complete(self._batches[0]):
            frame, _, bulk = self._batches.popleft()
            await control.send_frame(self._seq.wrap(frame, bulk))
            for bulk_id, payload in bulk:
                nursery.start_soon(self._send_bulk, conn, bulk_id, payload)

    async def _send_bulk(self, conn: Any, bulk_id: int, payload: bytes) -> None:
        s = await conn.open_stream()
        await s.send_frame(m.encode(m.Bulk(bulk_id, len(payload))))
        await s.send_frame(payload)
        await s.close()

    async def _receive_loop(self, control: Any) -> None:
        while True:
            frame = await control.receive_frame()
            if frame is None:
                await self._fatal("the server closed the session")
                self._stop.set()
                return
            if self._resume_token is None:
                self._resume_token = _welcome_token(frame)
            await self._write(r.CONTROL, 0, frame)

    async def _accept_bulk(self, conn: Any, nursery: trio.Nursery) -> None:
        while True:
            s = await conn.accept_stream()
            nursery.start_soon(self._receive_bulk, s)

    async def _receive_bulk(self, s: Any) -> None:
        header = await s.receive_frame()
        payload = await s.receive_frame()
        if header is None or payload is None:
            return
        try:
            (msg,) = m.decode(header)
        except (m.DecodeError, ValueError):
            return
        if isinstance(msg, m.Bulk):
            await self._write(r.BULK, msg.bulk_id, payload)


def _complete(batch: tuple[bytes, int, list[tuple[int, bytes]]]) -> bool:
    return len(batch[2]) == batch[1]


def _welcome_token(frame: bytes) -> bytes | None:
    """The resume token if ``frame`` holds the server's Welcome (its first frame does)."""
    try:
        msgs = m.decode(frame)
    except m.DecodeError:
        return None
    return next((w.resume_token for w in msgs if isinstance(w, m.Welcome)), None)


def _describe(exc: BaseException) -> str:
    """One line for an error that may be an exception group."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return str(exc) or type(exc).__name__


def main(argv: list[str] | None = None) -> None:
    # Ctrl-C in a terminal signals the whole process group: the user's process decides what
    # an interrupt means; this one ends only at CLOSE or when that process is gone.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fd, peer_id, host, port, *key = argv if argv is not None else sys.argv[1:]
    pipe = socket.socket(fileno=int(fd))
    link = LinkProcess(pipe, peer_id, (host, int(port)), key[0] if key else None)
    trio.run(link.run)


if __name__ == "__main__":
    main()
