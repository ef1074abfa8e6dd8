"""A real `burn-remote relay` subprocess on loopback, beside the remote suite's fixtures."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from remote.conftest import Server, client_home, spawn  # noqa: F401  (fixtures)


def start_relay(tmp: Path, *extra: str, prefix: tuple[str, ...] = ()) -> Server:
    """Start ``burn-remote relay`` (optionally under ``prefix``, e.g. ``ip netns exec``)."""
    tmp.mkdir(parents=True, exist_ok=True)
    exe = Path(sys.executable).with_name("burn-remote")
    cmd = [*prefix, str(exe), "relay", "--data-dir", str(tmp), *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peer = address = None
    lines: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (peer is None or address is None):
        line = proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            break
        lines.append(line)
        if mt := re.match(r"peer id: (\S+)", line):
            peer = mt.group(1)
        if mt := re.match(r"listening on: (\S+)", line):
            address = mt.group(1)
    if peer is None or address is None:
        proc.kill()
        raise RuntimeError("relay did not start:\n" + "".join(lines))
    return Server(proc, peer, address)


def stop_process(server: Server) -> str:
    server.proc.send_signal(signal.SIGTERM)
    try:
        out, _ = server.proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        out, _ = server.proc.communicate()
    return out or ""


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[Server]:
    r = start_relay(
        tmp_path / "relay", "--listen", "127.0.0.1:0", "--capture", str(tmp_path / "relay.capture")
    )
    yield r
    stop_process(r)


@pytest.fixture
def relay_capture(tmp_path: Path) -> Callable[[], list[bytes]]:
    def read() -> list[bytes]:
        data = (tmp_path / "relay.capture").read_bytes()
        out, i = [], 0
        while i + 4 <= len(data):
            n = int.from_bytes(data[i : i + 4], "big")
            out.append(data[i + 4 : i + 4 + n])
            i += 4 + n
        return out

    return read
