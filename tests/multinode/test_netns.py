"""Relay, two servers and a client in separate network namespaces (or compose services)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .client_job import MARKER
from .conftest import Lab, Server

pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.timeout(180)]

JOB = Path(__file__).with_name("client_job.py")
OUTAGE_JOB = Path(__file__).with_name("client_outage.py")


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
        *([lab.servers["s3"].peer_id] if "s3" in lab.servers else []),
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


def test_wildcard_listener_is_reached_through_the_relay(lab: Lab, observed: dict) -> None:
    """A server on ``0.0.0.0`` answers relayed clients (its replies used to be dropped by
    the tunnel, which expected them from loopback)."""
    if "s3" not in lab.servers:
        pytest.skip("the external lab's s2 listens on the wildcard address (see the test above)")
    assert observed["wildcard_address"][0] == lab.addr("cli")  # the tunnel's local shim
    assert observed["wildcard_equal"]


def test_relay_saw_only_ciphertext(lab: Lab, observed: dict) -> None:
    if lab.capture is None:
        pytest.skip("no capture of an external relay")
    data = lab.capture.read_bytes()
    assert len(data) > len(MARKER) * 4096
    assert MARKER not in data


def test_server_to_server_move_across_namespaces(observed: dict) -> None:
    assert observed["moved_sum"] == float(sum(range(1000)))


def test_move_from_a_server_the_client_reaches_only_through_the_relay(
    lab: Lab, observed: dict
) -> None:
    error = observed.get("moved_from_relayed_error")
    assert error is None, error
    assert observed["moved_from_relayed_sum"] == 2.0 * sum(range(1000))


def test_move_from_a_server_only_the_relay_connects_to_the_destination(
    lab: Lab, observed: dict
) -> None:
    """s3 -> s1: no route between them, so s1's server tunnels through its relay."""
    if "s3" not in lab.servers:
        pytest.skip("the external lab has no relay-only server")
    assert observed["moved_from_relay_only_sum"] == 3.0 * sum(range(1000))


def test_servers_all_reduce_over_their_own_links(lab: Lab, observed: dict) -> None:
    """A ring of every server (three in the namespace lab, where s1 and s3 have no route
    to each other and link through the relay; two in the compose lab)."""
    assert observed.get("ring_error") is None, observed.get("ring_error")
    assert observed["ring_ranks"] == len(lab.servers)
    assert observed["ring_equal"]
    if lab.names:  # each link chose its data plane, and said so in its server's log
        logs = {node: server.output() for node, server in lab.servers.items()}
        assert "ring data to rank 1 over TCP" in logs["s1"], logs["s1"]
        assert "ring data to rank 2 over TCP" in logs["s2"], logs["s2"]
        # s3 reaches s1 only through the relay: no TCP path, the QUIC link carries the data
        assert "ring data to rank 0 over QUIC (fallback: TCP data link to" in logs["s3"], logs["s3"]
        assert "ring data from rank 2 over QUIC" in logs["s1"], logs["s1"]


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


OUTAGE = 12.0
"""Seconds a server's network stays down: past the relay ping interval (10 s), so the ping
loop meets the unreachable network; under the QUIC idle timeout (30 s)."""


def test_relayed_server_survives_a_network_outage(lab: Lab, tmp_path: Path) -> None:
    """The server's link goes down (sends fail with ENETUNREACH, as under `docker network
    disconnect`) and comes back: the server keeps running and the session goes on."""
    if not lab.names:
        pytest.skip("the compose suite takes a container off its network instead")
    s2 = lab.servers["s2"]
    assert lab.relay is not None and isinstance(s2, Server)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    env = {**os.environ, "BURN_REMOTE_HOME": str(home), "BURN_REMOTE_PROBE_TIMEOUT": "2"}
    cmd = [*lab.exec_prefix("cli"), sys.executable, str(OUTAGE_JOB), lab.relay.address]
    client = subprocess.Popen(
        [*cmd, s2.peer_id, "4"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert client.stdin is not None and client.stdout is not None
    try:
        seen = [client.stdout.readline()]
        while seen[-1] and seen[-1].strip() != "OUTAGE":
            seen.append(client.stdout.readline())
        assert seen[-1].strip() == "OUTAGE", "".join(seen)
        subprocess.run([*lab.exec_prefix("s2"), "ip", "link", "set", "eth0", "down"], check=True)
        try:
            time.sleep(OUTAGE)
        finally:
            subprocess.run([*lab.exec_prefix("s2"), "ip", "link", "set", "eth0", "up"], check=True)
        client.stdin.write("\n")
        client.stdin.flush()
        out, _ = client.communicate(timeout=120)
    finally:
        if client.poll() is None:
            client.kill()
    # The outage outlasts the ping interval, so a registration refresh met ENETUNREACH
    # (whether all of its retries did depends on timing): the server must still run.
    assert s2.proc.poll() is None, s2.output()
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert lines, out
    result = json.loads(lines[-1][len("RESULT ") :])
    assert result == {"losses_equal": True, "weights_equal": True, "errors": 0}
