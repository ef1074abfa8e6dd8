"""A TCP relay for tests that can black-hole its connections (a cut TCP path: nothing
closes, nothing gets through), the TCP counterpart of the project's UDP fault proxy."""

from __future__ import annotations

import socket
import threading


class TcpCutProxy:
    """Listens on 127.0.0.1:0 and relays each connection to ``target`` (settable later)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.target: tuple[str, int] | None = None
        self.relayed = 0
        self._cut = threading.Event()
        self._stop = threading.Event()
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            assert self.target is not None, "set the proxy's target first"
            upstream = socket.create_connection(self.target)
            self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while not self._stop.is_set():
            if self._cut.is_set():  # hold the connection open, forward nothing
                self._stop.wait(0.1)
                continue
            try:
                data = src.recv(1 << 16)
                if not data:
                    return
                if self._cut.is_set():
                    continue  # lost on the cut path
                dst.sendall(data)
                self.relayed += len(data)
            except OSError:
                return

    def cut(self) -> None:
        self._cut.set()

    def stop(self) -> None:
        self._stop.set()
        for s in [self.sock, *self._open]:
            try:
                s.close()
            except OSError:
                pass
