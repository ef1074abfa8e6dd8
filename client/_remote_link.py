"""The I/O half of a remote device: a background thread running trio that owns the QUIC
connection and moves the frames of a :class:`ClientProtocol` in and out.

The user's thread never touches the network: it queues messages under ``cond``'s lock, calls
``kick()`` (thread-safe, returns at once) and, only when it needs data, waits on ``cond``.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import trio
from burn_remote.protocol import messages as m

from ._remote_protocol import Batch, ClientProtocol
from ._remote_resume import (
    ATTEMPT_TIMEOUT,
    RESUME_TIMEOUT,
    ClientSequencer,
    SequencedStream,
    SessionExpired,
)

CONNECT_TIMEOUT = 30.0
"""Seconds to wait for the connection before failing the first request."""


class Link:
    """Owns the background thread, the endpoint and the connection of one remote device."""

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
        self._token: Any = None
        self._wake: trio.Event | None = None
        self._stop: trio.Event | None = None
        self._started = threading.Event()
        self._thread: threading.Thread | None = None

    # --- user thread ------------------------------------------------------------------------
    def kick(self) -> None:
        """Ask the link to send what is pending; never blocks on the network."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"burn-remote-{self.peer_id[:8]}", daemon=True
            )
            self._thread.start()
            self._started.wait(CONNECT_TIMEOUT)
        token = self._token
        if token is not None:
            try:
                token.run_sync_soon(self._set_wake)
            except trio.RunFinishedError:
                pass

    def close(self) -> None:
        """Flush, close the connection and join the thread."""
        if self._thread is None or self._token is None:
            return
        try:
            self._token.run_sync_soon(lambda: self._stop and self._stop.set())
        except trio.RunFinishedError:
            pass
        self._thread.join(10)

    # --- trio thread ------------------------------------------------------------------------
    def _set_wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # surfaces to the user as the next wait's error
            self._fail(f"connection to {self.peer_id[:12]}... failed: {exc}")
        finally:
            self._started.set()
            self._fail("the connection is closed")

    def _fail(self, why: str) -> None:
        with self.cond:
            if self.protocol.fatal is None:
                self.protocol.fatal = why
            self.cond.notify_all()

    async def _main(self) -> None:
        from burn_remote.protocol.transport import (
            Endpoint,
            EndpointConfig,
            Identity,
            TransportError,
            default_key_path,
        )

        self._token = trio.lowlevel.current_trio_token()
        self._wake, self._stop = trio.Event(), trio.Event()
        self._wake.set()
        self._started.set()
        identity = Identity.load_or_create(self.key_path or default_key_path())
        bind = ("::", 0) if ":" in self.address[0] else ("0.0.0.0", 0)
        config = EndpointConfig(max_frame_size=m.MAX_FRAME)
        self._seq = seq = ClientSequencer()
        async with Endpoint.open(identity, bind=bind, config=config) as ep:
            with trio.fail_after(CONNECT_TIMEOUT):
                conn = await ep.connect(self.peer_id, self.address)
            resuming = False
            while True:  # one round per connection; a lost one is resumed (see _remote_resume)
                lost = False
                try:
                    await self._session(conn, seq, resuming)
                except* TransportError:
                    lost = not self._stop.is_set()
                if not lost:
                    break
                welcome = self.protocol.welcome
                if welcome is None or not welcome.resume_token:
                    raise TransportError("connection lost before the session was established")
                conn = await self._reconnect(ep)
                resuming = True
            await conn.close("client closing", flush_timeout=2.0)

    async def _session(self, conn: Any, seq: ClientSequencer, resuming: bool) -> None:
        """Run the loops on one connection (after resuming the session, on a new one)."""
        assert self._stop is not None
        control = SequencedStream(await conn.open_stream(), seq)
        async with trio.open_nursery() as nursery:
            if resuming:
                welcome = self.protocol.welcome
                assert welcome is not None
                await control.send_frame(seq.resume_frame(welcome.resume_token))
                try:
                    frames = await seq.resume(control.stream)
                except SessionExpired as exc:
                    self._fail(f"session expired: {exc}")
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
            assert self._wake is not None
            await self._wake.wait()
            self._wake = trio.Event()
            await self._send_pending(conn, control, nursery)

    async def _send_pending(self, conn: Any, control: Any, nursery: trio.Nursery) -> None:
        while True:
            with self.cond:
                batch: Batch | None = self.protocol.take()
            if batch is None:
                return
            await control.send_frame(self._seq.wrap(batch.frame, batch.bulk))
            for bulk_id, payload in batch.bulk:
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
                self._fail("the server closed the session")
                return
            with self.cond:
                self.protocol.receive_control(frame)
                self.cond.notify_all()
                again = bool(self.protocol.pending)  # a replay after UNKNOWN_GRAPH
            if again:
                self._set_wake()

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
            with self.cond:
                self.protocol.receive_bulk(msg.bulk_id, payload)
                self.cond.notify_all()


__all__ = ["Link"]
