"""Extensions remotely: a server runs only what its entry points installed; clients send no code.

`testext` (tests/support/extdemo_ops.py) is announced by a throwaway dist-info on the server's
PYTHONPATH. A server started with it runs the client's graph; one started without it refuses
the graph with an error naming the extension, and its session goes on.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from burn_remote import Device, OpFailed, RemoteDevice
from support.extdemo_ops import scale_shift

from .conftest import start_server, stop_server

TESTS = Path(__file__).resolve().parents[1]


def _site_with_testext(root: Path) -> Path:
    info = root / "burn_remote_testext-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: burn-remote-testext\nVersion: 0.1\n"
    )
    (info / "entry_points.txt").write_text(
        "[burn_remote.extensions]\ntestext = support.extdemo_ops:testext\n"
    )
    return root


def test_server_with_the_extension_runs_it_and_one_without_refuses(tmp_path, monkeypatch):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    site = _site_with_testext(tmp_path / "site")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(TESTS)]))
    with_ext = start_server(tmp_path / "with")
    monkeypatch.delenv("PYTHONPATH")
    without = start_server(tmp_path / "without")
    try:
        dev = RemoteDevice(with_ext.target)
        want = scale_shift(Device.cpu().tensor(x)).numpy()
        got = scale_shift(dev.tensor(x)).numpy()
        np.testing.assert_allclose(got, want)
        dev.close()

        other = RemoteDevice(without.target)
        y = scale_shift(other.tensor(x))
        with pytest.raises(OpFailed, match="testext"):
            y.numpy()
        assert float((other.tensor(x) * 2).sum().item()) == float(x.sum() * 2)  # goes on
        other.close()
    finally:
        stop_server(with_ext)
        stop_server(without)
