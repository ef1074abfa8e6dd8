"""Address discovery through a real NAT: a server in a private network behind a router
namespace that masquerades (iptables/nft, made here), a relay and a client on the public
side. The server learns from the relay the router's public address and port for its QUIC
socket and publishes it, signed, beside its private one.

Topology (private test ranges; every namespace is deleted in the finalizer)::

    hub bridge 10.232.0.0/24: relay .1, router .2 (public side), client .3
    router 10.232.1.1 -- server 10.232.1.2 (its default route is the router)
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import Lab, _ip, netns_refusal, start_relay, start_server, stop_process

pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.timeout(180)]

PUBLIC, PRIVATE = "10.232.0", "10.232.1"
RELAY, ROUTER, CLIENT = f"{PUBLIC}.1", f"{PUBLIC}.2", f"{PUBLIC}.3"
SERVER = f"{PRIVATE}.2"
CLIENT_JOB = Path(__file__).with_name("client_nat.py")


def _masquerade_command(ns: str) -> list[str] | None:
    """A command that makes ``ns`` masquerade what leaves its eth0, or None without tools."""
    if shutil.which("nft"):
        return ["sh", "-c", (
            f"ip netns exec {ns} nft add table ip nat && "
            f"ip netns exec {ns} nft 'add chain ip nat post {{ type nat hook postrouting "
            "priority srcnat; }' && "
            f"ip netns exec {ns} nft add rule ip nat post oifname eth0 masquerade"
        )]  # fmt: skip
    if shutil.which("iptables"):
        return ["ip", "netns", "exec", ns, "iptables", "-t", "nat", "-A", "POSTROUTING",
                "-o", "eth0", "-j", "MASQUERADE"]  # fmt: skip
    return None


def _veth(a: str, a_if: str, b: str, b_if: str) -> None:
    _ip("-n", a, "link", "add", a_if, "type", "veth", "peer", "name", b_if, "netns", b)


@pytest.fixture(scope="module")
def nat_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Lab, dict]]:
    if os.environ.get("BURN_REMOTE_LAB") == "external":
        pytest.skip("the NAT suite builds its own namespaces")
    reason = netns_refusal()
    if reason is not None:
        pytest.skip(reason)
    tag = secrets.token_hex(3)
    lab = Lab({n: f"brn{tag}-{n}" for n in ("hub", "relay", "router", "cli", "srv")})
    tmp = tmp_path_factory.mktemp("nat")
    procs: dict = {}
    try:
        for ns in lab.names.values():
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        hub = lab.names["hub"]
        _ip("-n", hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", hub, "link", "set", "br0", "up")
        for node, addr in (("relay", RELAY), ("router", ROUTER), ("cli", CLIENT)):
            ns = lab.names[node]
            _veth(hub, f"v{node}", ns, "eth0")
            _ip("-n", hub, "link", "set", f"v{node}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
        router, srv = lab.names["router"], lab.names["srv"]
        _veth(router, "eth1", srv, "eth0")
        _ip("-n", router, "addr", "add", f"{PRIVATE}.1/24", "dev", "eth1")
        _ip("-n", router, "link", "set", "eth1", "up")
        _ip("-n", srv, "addr", "add", f"{SERVER}/24", "dev", "eth0")
        _ip("-n", srv, "link", "set", "eth0", "up")
        _ip("-n", srv, "route", "add", "default", "via", f"{PRIVATE}.1")
        subprocess.run(["ip", "netns", "exec", router, "sysctl", "-qw", "net.ipv4.ip_forward=1"],
                       check=True, timeout=30)  # fmt: skip
        masq = _masquerade_command(router)
        if masq is None:
            pytest.skip("neither nft nor iptables is installed (Debian: apt-get install nftables)")
        subprocess.run(masq, check=True, capture_output=True, timeout=30)
        procs["relay"] = start_relay(
            tmp / "relay", "--listen", f"{RELAY}:7400", prefix=lab.exec_prefix("relay")
        )
        procs["server"] = start_server(
            tmp / "srv",
            "--listen", f"{SERVER}:7000",
            "--relay", f"{RELAY}:7400",
            prefix=lab.exec_prefix("srv"),
        )  # fmt: skip
        yield lab, procs
    finally:
        for proc in procs.values():
            if proc.proc.poll() is None:
                stop_process(proc)
        for ns in lab.names.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def test_server_behind_nat_learns_and_publishes_the_routers_public_address(
    nat_lab: tuple[Lab, dict], tmp_path: Path
) -> None:
    lab, procs = nat_lab
    server = procs["server"]
    seen = re.search(r"the relay sees us at (\S+?)\)", server.output())
    assert seen, server.output()
    host, port = seen.group(1).rsplit(":", 1)
    assert host == ROUTER  # the NAT's public address, not the server's own 10.232.1.2
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    env = {**os.environ, "BURN_REMOTE_HOME": str(home), "BURN_REMOTE_PROBE_TIMEOUT": "1"}
    done = subprocess.run(
        [*lab.exec_prefix("cli"), sys.executable, str(CLIENT_JOB), f"{RELAY}:7400",
         server.peer_id],
        env=env, capture_output=True, text=True, timeout=150,
    )  # fmt: skip
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout + done.stderr
    result = json.loads(lines[-1][len("RESULT ") :])
    # The signed record, as a client on the public side gets it: local, then reflexive.
    assert result["addresses"] == [f"{SERVER}:7000", f"{ROUTER}:{port}"]
    # Neither is reachable from outside without hole punching (the NAT filters unsolicited
    # datagrams), so the client ends on the relay tunnel, and the session still works.
    assert result["dialled"][0] == CLIENT
    assert result["losses_equal"]
