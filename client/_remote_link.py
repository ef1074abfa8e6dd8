"""The I/O half of a remote device: a link process (``_link_process``) that owns the QUIC
connection, and a reader thread here that hands the server's frames to the protocol.

The user's thread never touches the network. ``kick()`` takes what the protocol has pending
and writes it to the link process over a local socket: one write per batch, which the link
process reads eagerly (so the write never waits on the network). Replies are applied by the
reader thread under ``cond``'s lock, and waiters on ``cond`` are woken.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

from . import _link_records as r
from ._remote_protocol import ClientProtocol

CLOSE_TIMEOUT = 10.0
"""Seconds ``close`` waits for the link process to say goodbye to the server and exit."""
PIPE_BUFFER = 4 << 20
"""Bytes requested for the local socket's buffers: several steps fit without blocking."""


class Link:
    """Starts and feeds the link process of one remote device."""

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
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self._send_lock = threading.Lock()
        """Held from ``take()`` to the end of the write, so batches reach the link in order."""

    def kick(self) -> None:
        """Hand everything pending to the link process; never waits for the server."""
        with self._send_lock:
            if self._sock is None:
                self._start()
            while True:
                with self.cond:
                    if self.protocol.fatal is not None:
                        return
                    batch = self.protocol.take()
                if batch is None:
                    return
                try:
                    r.send_record(self._sock, r.BATCH, len(batch.bulk), batch.frame)
                    for bulk_id, payload in batch.bulk:
                        r.send_record(self._sock, r.BULK, bulk_id, payload)
                except OSError:
                    self._fail("the connection is closed (the link process ended)")
                    return

    def close(self) -> None:
        """Send what is pending, let the link say goodbye to the server, wait for it to end."""
        if self._sock is None:
            return
        self.kick()
        with self._send_lock:
            try:
                r.send_record(self._sock, r.CLOSE)
                self._sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        assert self._proc is not None and self._reader is not None
        try:
            self._proc.wait(CLOSE_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(CLOSE_TIMEOUT)
        self._sock.close()

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        for s in (ours, theirs):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, PIPE_BUFFER)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, PIPE_BUFFER)
        args = [str(theirs.fileno()), self.peer_id, self.address[0], str(self.address[1])]
        if self.key_path is not None:
            args.append(str(self.key_path))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "burn_remote._link_process", *args],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            env=env,
        )
        theirs.close()
        self._sock = ours
        self._reader = threading.Thread(
            target=self._read, name=f"burn-remote-{self.peer_id[:8]}", daemon=True
        )
        self._reader.start()

    def _read(self) -> None:
        """Apply the server's frames as they come; end of stream ends the device."""
        assert self._sock is not None
        while (record := r.read_record(self._sock)) is not None:
            kind, arg, payload = record
            if kind == r.FATAL:
                self._fail(payload.decode(errors="replace"))
                continue
            with self.cond:
                if kind == r.CONTROL:
                    self.protocol.receive_control(payload)
                elif kind == r.BULK:
                    self.protocol.receive_bulk(arg, payload)
                self.cond.notify_all()
                again = kind == r.CONTROL and bool(self.protocol.pending)
            if again:  # a replay after UNKNOWN_GRAPH
                self.kick()
        self._fail("the connection is closed")

    def _fail(self, why: str) -> None:
        with self.cond:
            if self.protocol.fatal is None:
                self.protocol.fatal = why
            self.cond.notify_all()


__all__ = ["Link"]
