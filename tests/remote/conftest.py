"""A real `burn-remote serve` subprocess on loopback, and a client identity per test."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

START_TIMEOUT = 60.0


class Server:
    def __init__(self, proc: subprocess.Popen, peer_id: str, address: str) -> None:
        self.proc, self.peer_id, self.address = proc, peer_id, address

    @property
    def target(self) -> str:
        return f"{self.peer_id}@{self.address}"


def start_server(tmp: Path, *extra: str, prefix: tuple[str, ...] = ()) -> Server:
    tmp.mkdir(parents=True, exist_ok=True)
    exe = Path(sys.executable).with_name("burn-remote")
    proc = subprocess.Popen(
        [
            *prefix,
            str(exe),
            "serve",
            "--device",
            "cpu",
            "--allow-any",
            "--data-dir",
            str(tmp),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    peer = address = None
    deadline = time.monotonic() + START_TIMEOUT
    lines = []
    while time.monotonic() < deadline and (peer is None or address is None):
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if mt := re.match(r"peer id: (\S+)", line):
            peer = mt.group(1)
        if mt := re.match(r"listening on: (\S+)", line):
            address = mt.group(1)
    if peer is None or address is None:
        proc.kill()
        raise RuntimeError("server did not start:\n" + "".join(lines))
    return Server(proc, peer, address)


def stop_server(server: Server) -> None:
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(30)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()


@pytest.fixture(autouse=True)
def client_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "client-home"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("BURN_REMOTE_HOME", str(home))
    monkeypatch.delenv("BURN_REMOTE_KEY", raising=False)
    return home


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    started: list[Server] = []

    def _spawn(*extra: str) -> Server:
        s = start_server(tmp_path / f"server{len(started)}", *extra)
        started.append(s)
        return s

    yield _spawn
    for s in started:
        stop_server(s)
        assert s.proc.returncode == 0, s.proc.stdout.read() if s.proc.stdout else ""


@pytest.fixture
def server(spawn: Callable[..., Server]) -> Server:
    return spawn()


def env_with_home(home: Path) -> dict[str, str]:
    return {**os.environ, "BURN_REMOTE_HOME": str(home)}
