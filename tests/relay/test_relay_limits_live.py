"""A real relay under a flood: one peer sends as fast as it can, another trains through the
same relay, and the relay holds the flooder to its bandwidth while the training goes on."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from burn_remote import Device, RemoteDevice
from burn_remote.server._relay_limits import BURST_SECONDS, MIB
from remote.mlp import train

from .conftest import start_relay, stop_process

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

FLOOD = Path(__file__).with_name("flood.py")
LIMIT_MIB = 2


def _dead_address() -> str:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"127.0.0.1:{port}"


def test_a_flooding_peer_is_held_to_its_limit_and_another_peer_still_trains(
    tmp_path: Path, spawn, monkeypatch: pytest.MonkeyPatch
) -> None:
    relay = start_relay(
        tmp_path / "relay", "--listen", "127.0.0.1:0", "--peer-bandwidth", str(LIMIT_MIB)
    )
    flood = None
    try:
        server = spawn("--relay", relay.address, "--advertise", _dead_address())
        monkeypatch.setenv("BURN_REMOTE_RELAY", relay.address)
        monkeypatch.setenv("BURN_REMOTE_PROBE_TIMEOUT", "1")
        flood = subprocess.Popen(
            [sys.executable, str(FLOOD), relay.address],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert flood.stdin is not None and flood.stdout is not None
        started = flood.stdout.readline()
        assert started.startswith("FLOODING "), started + flood.stdout.read()
        flooder = started.split()[1]
        dev = RemoteDevice(server.peer_id)  # the direct address is dead: through the relay
        got = train(dev, 3)
        dev.close()
        out, _ = flood.communicate("", timeout=60)
    finally:
        if flood is not None and flood.poll() is None:
            flood.kill()
        printed = stop_process(relay)
    want = train(Device.cpu(), 3)
    assert got["losses"] == want["losses"]
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got["weights"], want["weights"]))
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert lines, out
    seen = json.loads(lines[-1][len("RESULT ") :])
    bound = LIMIT_MIB * MIB * (seen["seconds"] + BURST_SECONDS) + 65536
    mib_s = {k: seen[k] / MIB / seen["seconds"] for k in ("sent", "received")}
    print(
        f"relay flood over {seen['seconds']:.1f} s: offered {mib_s['sent']:.1f} MiB/s, "
        f"forwarded {mib_s['received']:.2f} MiB/s (limit {LIMIT_MIB} MiB/s)"
    )
    assert seen["received"] <= bound, (seen, printed)  # the relay held the flooder back...
    assert seen["sent"] > 2 * bound, seen  # ...from a flood well past the limit
    assert seen["received"] > 0  # limited, not cut off
    assert f"peer {flooder} is over its relay limit" in printed, printed
    assert f"peer {server.peer_id} is over" not in printed
