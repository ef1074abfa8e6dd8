"""Data-parallel training across network namespaces: three CPU servers and a client, each in
a namespace of its own on one bridge (10.232.0.0/24, made and removed here), the servers
knowing each other's addresses. The client (dp_client.py, run in its namespace) trains 2 and
3 replicas of the digits MLP and the tiny GPT with LoRA against one server on the whole batch,
then loses a server mid-training and rebuilds on the survivors. The server is frozen
(SIGSTOP), then killed once the survivors have named it: a machine that loses power sends
nothing, not even the port refusal a killed process on a live host answers with
(tests/remote/test_dataparallel_remote.py covers that case)."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from remote.conftest import Server, start_server

from .conftest import _ip, netns_refusal

pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.timeout(600)]

NET = "10.232.0"
NODES = {"cli": 10, "s1": 11, "s2": 12, "s3": 13}
CLIENT = Path(__file__).with_name("dp_client.py")
TOLERANCE = 1e-5
"""Largest parameter difference from one server accepted: the rounding of another summation
order after a few steps is ~1e-7; a wrong average or a missing replica is ~1e-2."""


def _build(names: dict[str, str]) -> None:
    hub = names["hub"]
    for ns in names.values():
        _ip("netns", "add", ns)
        _ip("-n", ns, "link", "set", "lo", "up")
    _ip("-n", hub, "link", "add", "br0", "type", "bridge")
    _ip("-n", hub, "link", "set", "br0", "up")
    for node, host in NODES.items():
        ns, port = names[node], f"vh{host}"
        _ip("-n", hub, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("-n", hub, "link", "set", port, "master", "br0", "up")
        _ip("-n", ns, "addr", "add", f"{NET}.{host}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict, dict[str, Server]]]:
    reason = netns_refusal()
    if reason is not None:
        pytest.skip(reason)
    names = {n: f"brd{secrets.token_hex(3)}-{n}" for n in ["hub", *NODES]}
    tmp = tmp_path_factory.mktemp("dplab")
    servers: dict[str, Server] = {}
    try:
        _build(names)
        for node in ("s1", "s2", "s3"):
            prefix = ("ip", "netns", "exec", names[node])
            addr = f"{NET}.{NODES[node]}:7000"
            servers[node] = start_server(tmp / node, "--listen", addr, prefix=prefix)
        for s in servers.values():
            s.know(*[o for o in servers.values() if o is not s])
        yield names, servers
    finally:
        for s in servers.values():
            if s.proc.poll() is None:
                s.stop()
        for ns in names.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def observed(lab, tmp_path_factory: pytest.TempPathFactory) -> dict:
    names, servers = lab
    home = tmp_path_factory.mktemp("dp-client-home")
    home.chmod(0o700)
    env = {**os.environ, "BURN_REMOTE_HOME": str(home)}
    order = [servers[n] for n in ("s1", "s2", "s3")]
    cmd = ["ip", "netns", "exec", names["cli"], sys.executable, str(CLIENT)]
    cmd += [s.target for s in order]
    proc = subprocess.Popen(
        cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    lines: list[str] = []
    victim = None
    try:
        assert proc.stdout is not None and proc.stdin is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("KILL "):
                victim = order[int(line.split()[1])]
                victim.proc.send_signal(signal.SIGSTOP)  # silent from now on, mid-training
                proc.stdin.write("go\n")
                proc.stdin.flush()
            if line.startswith("SEEN") and victim is not None:
                victim.proc.kill()  # and gone for good
                victim.proc.wait(10)
        proc.wait(300)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read() if proc.stderr else ""
    results = [ln for ln in lines if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and results, "".join(lines) + err
    return json.loads(results[-1][len("RESULT ") :])


@pytest.mark.parametrize("case", ["mlp-2", "mlp-3", "gpt_lora-2", "gpt_lora-3"])
def test_replicas_on_namespaced_servers_equal_one_server_on_the_whole_batch(observed, case):
    got = observed["equal"][case]
    assert got["max_abs_diff"] < TOLERANCE, got
    assert got["loss_diff"] < 1e-4, got
    assert got["moved"] > 100 * TOLERANCE, got  # training changed the parameters at all


def test_a_killed_server_fails_every_survivor_and_two_replicas_continue(observed, lab):
    _, servers = lab
    fault = observed["fault"]
    print(f"GroupError {fault.get('seconds', 0):.1f} s after the server froze: {fault['raised']}")
    assert fault["raised"] is not None, "no error after a server was killed"
    assert fault["rank"] == 2 and fault["peer"] == servers["s3"].peer_id
    assert fault["dead"] == [2]
    assert fault["survivors_saw"]["0"] == ["GroupError", 2]  # every survivor names it
    assert fault["survivors_saw"]["1"] == ["GroupError", 2]
    assert fault["devices_after"] == 2
    assert fault["max_abs_diff"] < TOLERANCE, fault
