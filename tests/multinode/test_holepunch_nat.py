"""Hole punching through two real NATs: a client behind one masquerading router namespace,
a server behind another, a relay on the public side that both reach (all made here, deleted
in the finalizer; wrap runs in ``flock /tmp/burn-netns.lock``).

Topology (private test ranges)::

    hub bridge 10.233.0.0/24: relay .1, router A .2, router B .3
    router A 10.233.1.1 -- client 10.233.1.2      router B 10.233.2.1 -- server 10.233.2.2

The session is dialled by peer id: the server's record lists only addresses the client cannot
reach, so it starts through the relay; both sides then punch, and the session moves to the
direct path between the two routers' public mappings without the QUIC connection noticing.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .conftest import Lab, _ip, netns_refusal, start_relay, start_server, stop_process
from .natlab import cut, make_router, nat_tool

pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.timeout(240)]

PUBLIC = "10.233.0"
RELAY, ROUTER_A, ROUTER_B = f"{PUBLIC}.1", f"{PUBLIC}.2", f"{PUBLIC}.3"
CLIENT, SERVER = "10.233.1.2", "10.233.2.2"
CLIENT_JOB = Path(__file__).with_name("client_punch.py")


def _veth(a: str, a_if: str, b: str, b_if: str) -> None:
    _ip("-n", a, "link", "add", a_if, "type", "veth", "peer", "name", b_if, "netns", b)


def _link(ns: str, dev: str, addr: str) -> None:
    _ip("-n", ns, "addr", "add", addr, "dev", dev)
    _ip("-n", ns, "link", "set", dev, "up")


@pytest.fixture
def punch_lab(tmp_path: Path) -> Iterator[Callable[..., tuple[Lab, dict]]]:
    """Builds the lab on call: ``punch_lab(random_ports=...)`` -> (lab, processes)."""
    if os.environ.get("BURN_REMOTE_LAB") == "external":
        pytest.skip("the NAT suite builds its own namespaces")
    reason = netns_refusal()
    if reason is not None:
        pytest.skip(reason)
    if nat_tool() is None:
        pytest.skip("neither nft nor iptables is installed (Debian: apt-get install nftables)")
    tag = secrets.token_hex(3)
    lab = Lab({n: f"brp{tag}-{n}" for n in ("hub", "relay", "ra", "rb", "cli", "srv")})
    procs: dict = {}

    def build(*, random_ports: bool) -> tuple[Lab, dict]:
        for ns in lab.names.values():
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        hub = lab.names["hub"]
        _ip("-n", hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", hub, "link", "set", "br0", "up")
        for node, addr in (("relay", RELAY), ("ra", ROUTER_A), ("rb", ROUTER_B)):
            _veth(hub, f"v{node}", lab.names[node], "eth0")
            _ip("-n", hub, "link", "set", f"v{node}", "master", "br0", "up")
            _link(lab.names[node], "eth0", f"{addr}/24")
        for router, host, net, addr in (("ra", "cli", "10.233.1", CLIENT),
                                         ("rb", "srv", "10.233.2", SERVER)):  # fmt: skip
            r, h = lab.names[router], lab.names[host]
            _veth(r, "eth1", h, "eth0")
            _link(r, "eth1", f"{net}.1/24")
            _link(h, "eth0", f"{addr}/24")
            _ip("-n", h, "route", "add", "default", "via", f"{net}.1")
            subprocess.run(["ip", "netns", "exec", r, "sysctl", "-qw", "net.ipv4.ip_forward=1"],
                           check=True, timeout=30)  # fmt: skip
            make_router(r, random_ports=random_ports)
        procs["relay"] = start_relay(
            tmp_path / "relay", "--listen", f"{RELAY}:7400", prefix=lab.exec_prefix("relay")
        )
        procs["server"] = start_server(
            tmp_path / "srv",
            "--listen", f"{SERVER}:7000",
            "--relay", f"{RELAY}:7400",
            prefix=lab.exec_prefix("srv"),
        )  # fmt: skip
        return lab, procs

    try:
        yield build
    finally:
        for proc in procs.values():
            if proc.proc.poll() is None:
                stop_process(proc)
        for ns in lab.names.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def _client(lab: Lab, server_peer: str, home: Path, steps: int, cut_at: int = 0):
    home.mkdir(mode=0o700)
    env = {**os.environ, "BURN_REMOTE_HOME": str(home), "BURN_REMOTE_PROBE_TIMEOUT": "1"}
    return subprocess.Popen(
        [*lab.exec_prefix("cli"), sys.executable, str(CLIENT_JOB), f"{RELAY}:7400",
         server_peer, str(steps), str(cut_at)],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def _result(proc: subprocess.Popen, stdout: str, stderr: str) -> dict:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, stdout + stderr
    return json.loads(lines[-1][len("RESULT ") :])


def test_session_moves_to_the_direct_path_and_back_to_the_relay_when_it_is_cut(
    punch_lab, tmp_path: Path
) -> None:
    lab, procs = punch_lab(random_ports=False)
    server = procs["server"]
    proc = _client(lab, server.peer_id, tmp_path / "home", steps=14, cut_at=7)
    assert proc.stdout.readline().strip() == "CUT", proc.stderr.read()
    cut(lab.names["ra"], ROUTER_B)  # the relay (10.233.0.1) stays reachable
    stdout, stderr = proc.communicate("cut\n", timeout=180)
    result = _result(proc, stdout, stderr)
    print(f"\nNAT->NAT: direct after {result['move_s']:.2f} s from the dial; after the cut "
          f"the next step took {result['stalled_s']:.2f} s (fallback to the relay)")  # fmt: skip
    assert result["dialled"][0] == CLIENT  # our end of the relay tunnel: the session starts relayed
    log = server.output()
    # Both ends moved to the other's NAT mapping, and both went back to the relay.
    assert f"direct {ROUTER_B}:" in " ".join(result["paths"][:7]), result
    assert all(p.startswith("direct") for p in result["paths"][:8]), result
    assert result["final_path"] == "relay", result
    assert f": direct {ROUTER_A}:" in log, log
    assert log.rindex(": relay;") > log.index(f": direct {ROUTER_A}:"), log
    # Nothing lost on either move: the run equals a local one, bit for bit.
    assert result["losses_equal"] and result["weights_equal"], result


def test_symmetric_nats_keep_the_session_on_the_relay(punch_lab, tmp_path: Path) -> None:
    lab, procs = punch_lab(random_ports=True)
    proc = _client(lab, procs["server"].peer_id, tmp_path / "home", steps=4)
    stdout, stderr = proc.communicate(timeout=180)
    result = _result(proc, stdout, stderr)
    assert result["dialled"][0] == CLIENT
    assert result["move_s"] is None and set(result["paths"]) == {"relay"}, result
    assert result["final_path"] == "relay"
    assert result["losses_equal"] and result["weights_equal"], result
    assert ": direct" not in procs["server"].output()
