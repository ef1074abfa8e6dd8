"""Tensors of any size (up to the session quota) through a real `burn-remote serve`: bulk
transfers in chunks both ways, server-to-server moves, memory bounded, quota enforced."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from burn_remote import Device, OpFailed, RemoteDevice, nn

from .conftest import Server

pytestmark = pytest.mark.timeout(600)

MiB = 2**20


def _status(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def test_a_160_mib_tensor_goes_up_is_computed_on_and_comes_back(server: Server) -> None:
    """Larger than one frame (64 MiB) both ways: the issue's first finding."""
    dev = RemoteDevice(server.target)
    x = np.arange(40 * MiB, dtype=np.float32)
    t = dev.tensor(x)
    got = (t * 2 + 1).numpy()
    assert got.shape == x.shape and np.array_equal(got, x * 2 + 1)
    assert np.array_equal(t.numpy(), x)
    dev.close()


def test_a_transfer_over_the_session_quota_is_refused_and_the_session_goes_on(spawn) -> None:  # type: ignore[no-untyped-def]
    server = spawn("--session-memory", str(8 * MiB))
    dev = RemoteDevice(server.target)
    small = dev.tensor(np.ones(MiB // 4, np.float32))  # 1 MiB, a bulk transfer that fits
    big = dev.tensor(np.ones(4 * MiB, np.float32))  # 16 MiB: over the 8 MiB quota
    with pytest.raises(OpFailed, match="session memory quota"):
        dev.sync()
    del big
    stats = dev.session_stats()
    assert stats["session_bytes"] == MiB  # nothing of the refused transfer is held
    assert small.sum().item() == MiB // 4
    dev.close()


def test_a_small_frame_limit_announces_a_smaller_bulk_threshold_and_chunks(spawn) -> None:  # type: ignore[no-untyped-def]
    server = spawn("--max-frame", "100000")
    dev = RemoteDevice(server.target)
    x = np.arange(3 * MiB // 4, dtype=np.float32)  # 3 MiB in 100 000-byte chunks
    assert np.array_equal((dev.tensor(x) + 1).numpy(), x + 1)
    limits = dev._rt.proto.welcome.limits
    assert limits["bulk_threshold"] == 25_000 and limits["bulk_chunk"] == 100_000
    inline = np.arange(20_000, dtype=np.float32)  # 80 KB: under 100 000, over the threshold
    assert np.array_equal(dev.tensor(inline).numpy(), inline)
    dev.close()


@pytest.mark.slow
def test_one_gib_round_trip_with_peak_memory_within_twice_the_tensor(
    server: Server, tmp_path: Path
) -> None:
    """1 GiB up, computed on, read back and checked, through a client process whose peak
    RSS (and the server's) is measured: neither holds more than the tensor twice."""
    pid = server.proc.pid
    server_base = _status(pid, "VmRSS")
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("bulk_client.py")), server.target,
         str(tmp_path / "key"), "1024"],
        capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    client = json.loads(proc.stdout.strip().splitlines()[-1])
    size = client["bytes"]
    client_peak = client["hwm"] - client["base"]
    server_peak = _status(pid, "VmHWM") - server_base
    print(
        f"\n1 GiB round trip: client peak +{client_peak / MiB:.0f} MiB, "
        f"server peak +{server_peak / MiB:.0f} MiB (tensor {size / MiB:.0f} MiB)"
    )
    assert client_peak <= 2 * size + 64 * MiB
    assert server_peak <= 2 * size + 64 * MiB


@pytest.mark.slow
def test_a_300_mib_server_to_server_move(spawn) -> None:  # type: ignore[no-untyped-def]
    a_srv, b_srv = spawn(), spawn()
    b_srv.know(a_srv)  # b dials a at the address in its own book, never one from the client
    a, b = RemoteDevice(a_srv.target), RemoteDevice(b_srv.target)
    n = 300 * MiB // 4
    t = a.tensor(np.arange(n, dtype=np.float32)) + 1
    moved = t.to(b)
    assert moved.sum().item() == pytest.approx(t.sum().item(), rel=1e-6)
    got = moved.numpy()
    assert np.array_equal(got, np.arange(n, dtype=np.float32) + 1)
    assert b.stats()["data_bytes_sent"] == 0 and a.stats()["data_bytes_received"] < 1024
    a.close()
    b.close()


@pytest.mark.slow
def test_gpt2_small_sized_weights_on_a_remote_device_forward_like_the_cpu(
    server: Server,
) -> None:
    """124 M parameters (random init): the 154 MB token embedding alone is over a frame."""
    config = nn.GPTConfig(n_layer=12, n_head=12, d_model=768, vocab=50257, context=1024)
    nn.seed(0)
    model = nn.GPT(config)
    assert 124_000_000 < model.num_parameters() < 125_000_000
    ids = np.random.default_rng(0).integers(0, config.vocab, (1, 16))
    want = model(Device.cpu().tensor(ids)).numpy()
    dev = RemoteDevice(server.target)
    model.to(dev)
    got = model(dev.tensor(ids)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    dev.close()
