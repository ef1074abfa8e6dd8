"""Relay, two servers and a client in separate network namespaces (or compose services)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .client_job import MARKER
from .conftest import Lab

pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.timeout(180)]

JOB = Path(__file__).with_name("client_job.py")


@pytest.fixture(scope="module")
def observed(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Run the client once in its namespace; the tests below check what it saw."""
    assert lab.relay is not None
    home = tmp_path_factory.mktemp("client-home")
    home.chmod(0o700)
    env = {**os.environ, "BURN_REMOTE_HOME": str(home), "BURN_REMOTE_PROBE_TIMEOUT": "2"}
    prefix = lab.exec_prefix("cli") if lab.names else ()
    cmd = [
        *prefix,
        sys.executable,
        str(JOB),
        lab.relay.address,
        lab.servers["s1"].peer_id,
        lab.servers["s2"].peer_id,
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout + done.stderr
    return json.loads(lines[-1][len("RESULT ") :])


def test_direct_path_is_used_when_it_works(lab: Lab, observed: dict) -> None:
    if lab.names:
        assert observed["direct_address"] == [lab.addr("s1"), 7000]
    assert observed["direct_equal"]


def test_no_direct_route_goes_through_the_relay(lab: Lab, observed: dict) -> None:
    host = observed["relayed_address"][0]
    if lab.names:  # the tunnel's local shim, in the client's own namespace
        assert host == lab.addr("cli")
    assert observed["relayed_equal"] and observed["marker_roundtrip"]


def test_relay_saw_only_ciphertext(lab: Lab, observed: dict) -> None:
    if lab.capture is None:
        pytest.skip("no capture of an external relay")
    data = lab.capture.read_bytes()
    assert len(data) > len(MARKER) * 4096
    assert MARKER not in data


def test_server_to_server_move_across_namespaces(observed: dict) -> None:
    assert observed["moved_sum"] == float(sum(range(1000)))


def test_netns_really_isolates(lab: Lab) -> None:
    if not lab.names:
        pytest.skip("external lab")
    code = (
        "import socket, sys; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "try:\n    s.sendto(b'x', (sys.argv[1], 9)); print('sent')\n"
        "except OSError as e:\n    print('refused', e.errno)"
    )
    cli = lab.exec_prefix("cli")

    def reach(node: str) -> str:
        done = subprocess.run(
            [*cli, sys.executable, "-c", code, lab.addr(node)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return done.stdout.strip()

    assert reach("s1") == "sent"
    assert reach("s2").startswith("refused")  # no route: the kernel refuses at once
