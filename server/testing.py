"""`burn-remote` daemons as real subprocesses, for tests, examples and benchmarks.

Public like trio's testing helpers: a test of a program built on burn-remote wants a real
server too. The daemon's output is drained on a thread, so a chatty server never blocks on
a full pipe, and kept for the message of a failed start or stop.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

START_TIMEOUT = 60.0
"""Seconds a daemon may take to print its peer id and address."""
STOP_TIMEOUT = 30.0
"""Seconds a daemon may take to exit after SIGTERM before it is killed."""


class Daemon:
    """A running `burn-remote serve` or `burn-remote relay`."""

    def __init__(
        self,
        proc: subprocess.Popen,
        peer_id: str,
        address: str,
        lines: list[str],
        data_dir: str | Path = "",
    ):
        self.proc, self.peer_id, self.address = proc, peer_id, address
        self.data_dir = Path(data_dir)
        """Its ``--data-dir``."""
        self.http: str | None = None
        """``http://host:port`` of the operator port (``--http``), if it has one."""
        self._lines = lines
        self._drain = threading.Thread(target=self._read, daemon=True)
        self._drain.start()

    @property
    def target(self) -> str:
        """What `RemoteDevice` takes: ``peer@host:port``."""
        return f"{self.peer_id}@{self.address}"

    def _read(self) -> None:
        for line in self.proc.stdout or ():
            self._lines.append(line)

    def know(self, *others: Daemon) -> None:
        """Add ``others`` to this server's address book (``DATA_DIR/addresses.toml``, read
        again on change), so it may dial them: a server-to-server move *to* this server from
        one of them needs it (servers never dial an address a client names)."""
        book = Path(self.data_dir) / "addresses.toml"
        lines = [book.read_text()] if book.exists() else []
        for other in others:
            lines.append(f'[[peer]]\nid = "{other.peer_id}"\naddresses = ["{other.address}"]\n')
        tmp = book.with_suffix(".tmp")
        tmp.write_text("".join(lines))
        tmp.replace(book)  # never half written when the server reads it

    def output(self) -> str:
        """Everything the daemon printed so far."""
        return "".join(self._lines)

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM (a clean shutdown), SIGKILL past `timeout`; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._drain.join(5)
        return self.proc.returncode


def start_daemon(
    command: str,
    data_dir: str | Path,
    *args: str,
    prefix: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = START_TIMEOUT,
) -> Daemon:
    """Run ``burn-remote COMMAND --data-dir DATA_DIR ARGS...`` and wait until it listens.

    `prefix` goes before the program (``ip netns exec NAME``). Raises RuntimeError with the
    daemon's output when it exits or stays silent instead.
    """
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    exe = Path(sys.executable).with_name("burn-remote")
    proc = subprocess.Popen(
        [*prefix, str(exe), command, "--data-dir", str(data_dir), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=None if env is None else dict(env),
    )
    peer = address = http = None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    banner_done = command != "serve"  # serve's banner ends with "connect with:"
    while time.monotonic() < deadline and (peer is None or address is None or not banner_done):
        line = proc.stdout.readline() if proc.stdout else ""
        if not line:
            break
        lines.append(line)
        if mt := re.match(r"peer id: (\S+)", line):
            peer = mt.group(1)
        if mt := re.match(r"listening on: (\S+)", line):
            address = mt.group(1)
        if mt := re.match(r"http: (\S+)", line):
            http = mt.group(1)
        banner_done = banner_done or line.startswith("connect with:")
    if peer is None or address is None:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"burn-remote {command} did not start:\n" + "".join(lines))
    daemon = Daemon(proc, peer, address, lines, data_dir)
    daemon.http = http
    return daemon


def start_server(data_dir: str | Path, *args: str, device: str = "cpu", **kw: object) -> Daemon:
    """``burn-remote serve --device DEVICE --allow-any``: an open server for local use."""
    return start_daemon("serve", data_dir, "--device", device, "--allow-any", *args, **kw)  # type: ignore[arg-type]


__all__ = ["Daemon", "start_daemon", "start_server"]
