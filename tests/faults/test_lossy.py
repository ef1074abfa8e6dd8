"""Training through a lossy, reordering link gives exactly the clean link's numbers."""

from __future__ import annotations

import time

import numpy as np
import pytest
from burn_remote import Device, RemoteDevice
from burn_remote.protocol.transport.faultproxy import FaultProxy, Faults
from remote.conftest import Server
from remote.mlp import train

pytestmark = pytest.mark.timeout(120)

LOSSY = Faults(drop=0.10, reorder=0.2, reorder_delay=0.005, duplicate=0.02)


def test_lossy_reordering_link_trains_identically(server: Server, tmp_path) -> None:
    host, port = server.address.rsplit(":", 1)
    proxy = FaultProxy.start_thread((host, int(port)), faults=LOSSY, seed=7)
    try:
        ph, pp = proxy.address
        dev = RemoteDevice(f"{server.peer_id}@{ph}:{pp}", key=tmp_path / "k")
        lossy = train(dev, 4)
        # Throughput over the lossy link: one 4 MiB upload, read back (both directions).
        blob = np.arange(1 << 20, dtype=np.float32)
        t0 = time.perf_counter()
        back = dev.tensor(blob).numpy()
        seconds = time.perf_counter() - t0
        dev.close()
        stats = proxy.stats
    finally:
        proxy.stop()
    clean = train(Device.cpu(), 4)
    assert lossy["losses"] == clean["losses"]
    for a, b in zip(lossy["weights"], clean["weights"]):
        assert a.tobytes() == b.tobytes()
    assert back.tobytes() == blob.tobytes()
    assert stats.dropped > 0 and stats.reordered > 0  # the faults really happened
    mib = 2 * blob.nbytes / 2**20
    print(f"\nlossy link (10% loss, 20% reorder): {mib / seconds:.1f} MiB/s round trip, {stats}")


def test_proxy_cut_drops_everything_then_recovers() -> None:
    import socket

    echo = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    echo.bind(("127.0.0.1", 0))
    echo.settimeout(5)
    proxy = FaultProxy.start_thread(echo.getsockname(), seed=1)
    cli = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    cli.settimeout(5)
    try:
        cli.sendto(b"one", proxy.address)
        assert echo.recvfrom(100)[0] == b"one"
        proxy.cut(30)
        time.sleep(0.05)
        cli.sendto(b"lost", proxy.address)
        echo.settimeout(0.3)
        with pytest.raises(TimeoutError):
            echo.recvfrom(100)
        assert proxy.stats.cut >= 1
        proxy.cut(0)
        time.sleep(0.05)
        cli.sendto(b"two", proxy.address)
        echo.settimeout(5)
        assert echo.recvfrom(100)[0] == b"two"
    finally:
        proxy.stop()
        cli.close()
        echo.close()


def test_faults_validate() -> None:
    with pytest.raises(ValueError):
        Faults(drop=1.5)
