"""`burn-remote serve --device opencl` trains the digits MLP to >= 95% over the network."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import _UNAVAILABLE


def _serve_available() -> str | None:
    try:
        from burn_remote.server import cli
    except ImportError as exc:
        return f"server not available ({exc})"
    if not hasattr(cli, "cmd_serve"):
        return "server not available: burn_remote.server.cli has no serve command"
    try:
        from burn_remote import RemoteDevice  # noqa: F401
    except ImportError:
        return "server not available: burn_remote has no RemoteDevice"
    return None


pytestmark = [
    pytest.mark.skipif(_serve_available() is not None, reason=_serve_available() or ""),
    pytest.mark.skipif(_UNAVAILABLE["opencl"] is not None, reason=_UNAVAILABLE["opencl"] or ""),
    pytest.mark.timeout(300),
]


def _start(data_dir: Path) -> tuple[subprocess.Popen, str]:
    exe = Path(sys.executable).with_name("burn-remote")
    proc = subprocess.Popen(
        [str(exe), "serve", "--device", "opencl", "--allow-any", "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    peer = address = None
    lines: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (peer is None or address is None):
        line = proc.stdout.readline() if proc.stdout else ""
        if not line:
            break
        lines.append(line)
        if mt := re.match(r"peer id: (\S+)", line):
            peer = mt.group(1)
        if mt := re.match(r"listening on: (\S+)", line):
            address = mt.group(1)
    if peer is None or address is None:
        proc.kill()
        raise RuntimeError("burn-remote serve --device opencl did not start:\n" + "".join(lines))
    return proc, f"{peer}@{address}"


def test_serve_opencl_trains_digits_mlp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from burn_remote import RemoteDevice

    home = tmp_path / "client-home"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("BURN_REMOTE_HOME", str(home))
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
    import digits

    proc, target = _start(tmp_path / "server")
    try:
        dev = RemoteDevice(target)
        _, losses, acc = digits.train(dev, epochs=12)
        dev.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert losses[-1] < losses[0] / 4
    assert acc >= 0.95, f"test accuracy {acc:.3f} on serve --device opencl"
