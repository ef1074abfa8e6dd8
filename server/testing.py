"""`burn-remote` daemons as real subprocesses, for tests, examples and benchmarks.

Public like trio's testing helpers: a test of a program built on burn-remote wants a real
server too. The daemon's stdout (its banner) and stderr (its logs) are drained on a thread
each, so a chatty server never blocks on a full pipe, and kept for the message of a failed
start or stop. A daemon started here ends with the process that started it (Linux): a test
run killed outright (a CI timeout, ``kill -9``) leaves no server behind holding ports, CPU
and data directories for the next run.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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
        drains: Sequence[threading.Thread] = (),
    ):
        self.proc, self.peer_id, self.address = proc, peer_id, address
        self.data_dir = Path(data_dir)
        """Its ``--data-dir``."""
        self.http: str | None = None
        """``http://host:port`` of the operator port (``--http``), if it has one."""
        self._lines = lines
        self._drains = list(drains)

    @property
    def target(self) -> str:
        """What `RemoteDevice` takes: ``peer@host:port``."""
        return f"{self.peer_id}@{self.address}"

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
        """Everything the daemon printed so far (stdout and stderr, whole lines, in the
        order they were read)."""
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
        for drain in self._drains:
            drain.join(5)
        return self.proc.returncode


class _Banner:
    """What the daemon announces on stdout, parsed line by line as it arrives.

    The banner is read from stdout only: logs go to stderr, so a log line written while the
    banner is printed cannot land inside it (with both on one pipe, a job's log line once
    split ``peer id: ...``). Each line must be exactly ``key: value``."""

    PATTERNS = {
        "peer": re.compile(r"peer id: (\S+)"),
        "address": re.compile(r"listening on: (\S+)"),
        "http": re.compile(r"http: (\S+) \(.*\)|http: (\S+)"),
    }

    def __init__(self, command: str) -> None:
        self.found: dict[str, str] = {}
        self.complete = threading.Event()
        """Set when the banner is whole, or stdout ended."""
        self._needs_end = command == "serve"  # serve's banner ends with "connect with:"

    def feed(self, line: str) -> None:
        if self.complete.is_set():
            return
        text = line.rstrip("\r\n")
        for key, pattern in self.PATTERNS.items():
            if key not in self.found and (mt := pattern.fullmatch(text)):
                self.found[key] = next(g for g in mt.groups() if g)
        if text.startswith("connect with: "):
            self._needs_end = False
        if "peer" in self.found and "address" in self.found and not self._needs_end:
            self.complete.set()


_PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal a process gets when its parent thread ends (Linux)."""


def _end_with_parent(parent: int) -> Any:
    """A ``preexec_fn`` that asks the kernel to SIGTERM the daemon (its clean shutdown) when
    the process that started it dies, or None where that cannot be asked.

    Only from the main thread: the kernel ties the signal to the *thread* that forked, so a
    daemon started on a worker thread would be stopped when that thread ends, not the
    process. Where the parent died between fork and prctl, the child stops itself."""
    if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


def _drain(stream: Any, lines: list[str], banner: _Banner | None = None) -> None:
    """Keep every line (whole: one append per line) until the stream ends."""
    for line in stream:
        lines.append(line)
        if banner is not None:
            banner.feed(line)
    if banner is not None:
        banner.complete.set()


def start_daemon(
    command: str,
    data_dir: str | Path,
    *args: str,
    prefix: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = START_TIMEOUT,
) -> Daemon:
    """Run ``burn-remote COMMAND --data-dir DATA_DIR ARGS...`` and wait until it listens.
    A server without ``--listen`` in ARGS gets a free port (``127.0.0.1:0``).

    `prefix` goes before the program (``ip netns exec NAME``). Raises RuntimeError with the
    daemon's output when it exits or stays silent instead.
    """
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    exe = Path(sys.executable).with_name("burn-remote")
    if command == "serve" and "--listen" not in args:  # not the fixed default port: tests
        args = ("--listen", "127.0.0.1:0", *args)  # run many servers side by side
    proc = subprocess.Popen(
        [*prefix, str(exe), command, "--data-dir", str(data_dir), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=None if env is None else dict(env),
        preexec_fn=_end_with_parent(os.getpid()),
    )
    lines: list[str] = []
    banner = _Banner(command)
    drains = [
        threading.Thread(target=_drain, args=(proc.stdout, lines, banner), daemon=True),
        threading.Thread(target=_drain, args=(proc.stderr, lines), daemon=True),
    ]
    for drain in drains:
        drain.start()
    banner.complete.wait(timeout)
    peer, address = banner.found.get("peer"), banner.found.get("address")
    if peer is None or address is None or not banner.complete.is_set():
        proc.kill()
        proc.wait()
        for drain in drains:
            drain.join(5)
        raise RuntimeError(f"burn-remote {command} did not start:\n" + "".join(lines))
    daemon = Daemon(proc, peer, address, lines, data_dir, drains)
    daemon.http = banner.found.get("http")
    return daemon


def start_server(data_dir: str | Path, *args: str, device: str = "cpu", **kw: object) -> Daemon:
    """``burn-remote serve --device DEVICE --allow-any``: an open server for local use."""
    return start_daemon("serve", data_dir, "--device", device, "--allow-any", *args, **kw)  # type: ignore[arg-type]


__all__ = ["Daemon", "start_daemon", "start_server"]
