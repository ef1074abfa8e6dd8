"""Hole punching on loopback: a session dialled through the relay moves to a direct path
under QUIC (the connection never notices) and trains exactly as a local run."""

from __future__ import annotations

import socket
import time

import pytest
from burn_remote import Device, RemoteDevice
from remote.conftest import Server
from remote.mlp import train

pytestmark = pytest.mark.timeout(120)

MOVE_WAIT = 10.0
"""Seconds the move to the direct path may take (it takes well under one on loopback)."""


def _closed_port() -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize("engine", ["aioquic", "qh3"])  # the server's QUIC engine
def test_relayed_session_moves_to_the_direct_path(
    relay: Server, spawn, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    monkeypatch.setenv("BURN_REMOTE_DIRECT", "1")
    server = spawn(
        "--relay",
        relay.address,
        "--advertise",
        f"127.0.0.1:{_closed_port()}",
        "--quic-engine",
        engine,
    )
    monkeypatch.setenv("BURN_REMOTE_RELAY", relay.address)
    monkeypatch.setenv("BURN_REMOTE_PROBE_TIMEOUT", "1")
    dev = RemoteDevice(server.peer_id)
    assert dev.stats()["path"] in ("relay",) or dev.stats()["path"].startswith("direct 127.")
    got = train(dev, 2)
    deadline = time.monotonic() + MOVE_WAIT
    while not dev.stats()["path"].startswith("direct") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert dev.stats()["path"].startswith("direct 127.0.0.1:"), dev.stats()
    got2 = train(dev, 2)
    want = train(Device.cpu(), 2)
    assert got["losses"] == want["losses"] and got2["losses"] == want["losses"]
    dev.close()
    assert "path to" in server.output() and ": direct 127.0.0.1:" in server.output()
