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
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .conftest import Lab, netns_refusal, start_relay, start_server, stop_process
from .natlab import (
    CLIENT,
    NODES,
    RELAY,
    ROUTER_A,
    ROUTER_B,
    SERVER,
    build_two_nats,
    cut,
    nat_tool,
    remove,
)

pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.timeout(240)]

CLIENT_JOB = Path(__file__).with_name("client_punch.py")


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
    lab = Lab({n: f"brp{tag}-{n}" for n in NODES})
    procs: dict = {}

    def build(*, random_ports: bool) -> tuple[Lab, dict]:
        build_two_nats(lab.names, random_ports=random_ports)
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
        remove(lab.names)


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
    # The server's end moves on its own clock (its PING to NAT A's mapping answered): on a
    # loaded host it can come after the client's, so the cut waits for it (else the server
    # never saw a direct path to leave)
    deadline = time.monotonic() + 30
    while f": direct {ROUTER_A}:" not in server.output() and time.monotonic() < deadline:
        time.sleep(0.1)
    cut(lab.names["ra"], ROUTER_B)  # the relay (10.233.0.1) stays reachable
    stdout, stderr = proc.communicate("cut\n", timeout=180)
    result = _result(proc, stdout, stderr)
    if os.environ.get("NAT_DEBUG"):  # the client's and the server's path logs
        print(stderr[-3000:], server.output()[-3000:])
    print(f"\nNAT->NAT: direct after {result['move_s']:.2f} s from the dial; after the cut "
          f"the next step took {result['stalled_s']:.2f} s (fallback to the relay)")  # fmt: skip
    assert result["dialled"][0] == CLIENT  # our end of the relay tunnel: the session starts relayed
    log = server.output()
    # Both ends moved to the other's NAT mapping, and both went back to the relay.
    assert result["paths"][0].startswith(f"direct {ROUTER_B}:"), result  # NAT B's mapping
    assert result["paths"][7].startswith("direct"), result  # still direct when it is cut
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
