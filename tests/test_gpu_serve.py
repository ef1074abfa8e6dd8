"""`burn-remote serve --device opencl` trains the digits MLP to >= 95% over the network."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from burn_remote import RemoteDevice
from burn_remote.server.testing import start_server
from conftest import _UNAVAILABLE

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import digits  # noqa: E402

pytestmark = [
    pytest.mark.skipif(_UNAVAILABLE["opencl"] is not None, reason=_UNAVAILABLE["opencl"] or ""),
    pytest.mark.timeout(300),
]


def test_serve_opencl_trains_digits_mlp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    home = tmp_path / "client-home"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("BURN_REMOTE_HOME", str(home))
    server = start_server(tmp_path / "server", device="opencl")
    try:
        dev = RemoteDevice(server.target)
        _, losses, acc = digits.train(dev, epochs=12)
        dev.close()
    finally:
        assert server.stop() == 0, server.output()
    assert losses[-1] < losses[0] / 4
    assert acc >= 0.95, f"test accuracy {acc:.3f} on serve --device opencl"
