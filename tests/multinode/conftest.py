"""A small network built from Linux network namespaces, created and removed by the tests.

Topology (addresses in the private test range 10.231.0.0/24, on interfaces made here only)::

        hub namespace: bridge br0
          |         |          |          |          |
        relay .1   s1 .11     s2 .12     s3 .13    client .10

The client gets ``unreachable`` routes to s2 and s3 (and they to it), so their only path is
the relay; s1 and s3 cannot reach each other either. s3 listens on the wildcard address
(``0.0.0.0``), as containers and Kubernetes pods do: its record lists only the address the
relay saw it at, and relayed traffic enters its port from the tunnel.
Every namespace is deleted in the fixture's finalizer, also when a test fails.

With ``BURN_REMOTE_LAB=external`` (the docker-compose test runner) the suite instead uses
running services named by ``BURN_REMOTE_LAB_RELAY`` and ``BURN_REMOTE_LAB_PEERS`` (files with
the two servers' peer ids); there s2 advertises an unroutable address to force the relay.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from relay.conftest import start_relay, stop_process
from remote.conftest import Server, start_server

NET = "10.231.0"
NODES = {"relay": 1, "s1": 11, "s2": 12, "s3": 13, "cli": 10}
RELAYED = ("s2", "s3")
"""Servers the client can reach only through the relay."""
CUT = (("cli", "s2"), ("cli", "s3"), ("s1", "s3"))
"""Pairs of nodes with no route between them."""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def netns_refusal() -> str | None:
    """Why namespaces cannot be used here, or None when they can."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (CI runs these as root)"
    probe = f"brtprobe{secrets.token_hex(3)}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as exc:
        return f"this machine refuses `ip netns add`: {exc.stderr.strip()}"
    _ip("netns", "del", probe)
    return None


@dataclass(frozen=True)
class Service:
    """A node the lab did not start (a compose service): what a client needs to reach it."""

    peer_id: str
    address: str
    """``host:port``; empty for a server found through the relay."""


@dataclass
class Lab:
    """The namespaces and the processes running in them (or the services it was given)."""

    names: dict[str, str]
    relay: Server | Service | None = None
    servers: dict[str, Server | Service] = field(default_factory=dict)
    capture: Path | None = None

    def exec_prefix(self, node: str) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.names[node])

    def addr(self, node: str) -> str:
        return f"{NET}.{NODES[node]}"


def _build(lab: Lab) -> None:
    hub = lab.names["hub"]
    for ns in lab.names.values():
        _ip("netns", "add", ns)
        _ip("-n", ns, "link", "set", "lo", "up")
    _ip("-n", hub, "link", "add", "br0", "type", "bridge")
    _ip("-n", hub, "link", "set", "br0", "up")
    for node, host in NODES.items():
        ns, port = lab.names[node], f"vh{host}"
        _ip("-n", hub, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("-n", hub, "link", "set", port, "master", "br0", "up")
        _ip("-n", ns, "addr", "add", f"{NET}.{host}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
    # No direct route between the client and s2 or s3, nor s1 and s3: only the relay.
    for a, b in CUT:
        _ip("-n", lab.names[a], "route", "add", "unreachable", f"{lab.addr(b)}/32")
        _ip("-n", lab.names[b], "route", "add", "unreachable", f"{lab.addr(a)}/32")


def external_lab(env: Mapping[str, str]) -> Lab:
    """Services started elsewhere (docker-compose): a relay and two servers, whose peer ids
    are in the files that ``BURN_REMOTE_LAB_PEERS`` names (comma-separated, s1 then s2)."""
    lab = Lab({}, relay=Service("", env["BURN_REMOTE_LAB_RELAY"]))
    paths = env["BURN_REMOTE_LAB_PEERS"].split(",")
    if len(paths) != 2:
        raise ValueError(f"BURN_REMOTE_LAB_PEERS names {len(paths)} files, not 2: {paths}")
    for node, path in zip(("s1", "s2"), paths):
        lab.servers[node] = Service(_wait_for_id(Path(path)), "")
    return lab


SERVICE_WAIT = 90.0
"""Seconds the runner waits for a compose service's peer id and relay record."""


def _wait_for_id(path: Path) -> str:
    """The peer id a server's entrypoint writes before it starts (services start in any
    order; the runner may be first)."""
    deadline = time.monotonic() + SERVICE_WAIT
    while not (path.exists() and path.read_text().strip()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no peer id in {path} after {SERVICE_WAIT:g} s")
        time.sleep(0.2)
    return path.read_text().strip()


def _wait_for_records(lab: Lab) -> None:
    """Until the relay holds every server's record (each publishes once it listens)."""
    from burn_remote.protocol.relay import RelayAgent, RelayError
    from burn_remote.protocol.transport import PeerId

    assert lab.relay is not None
    deadline = time.monotonic() + SERVICE_WAIT
    for node in lab.servers.values():
        while True:
            try:
                if RelayAgent.get(lab.relay.address).lookup(PeerId.parse(node.peer_id)):
                    break
            except RelayError:
                pass  # the relay is still starting
            if time.monotonic() > deadline:
                raise TimeoutError(f"the relay has no record of {node.peer_id} yet")
            time.sleep(0.5)


def _teardown(lab: Lab) -> None:
    agent = sys.modules.get("burn_remote.protocol.relay._agent")
    if agent is not None:
        agent.RelayAgent.close_all()  # or it keeps re-registering with the dead relay
    for node in [lab.relay, *lab.servers.values()]:
        if isinstance(node, Server) and node.proc.poll() is None:
            stop_process(node)
    for ns in lab.names.values():
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    if os.environ.get("BURN_REMOTE_LAB") == "external":
        lab = external_lab(os.environ)
        _wait_for_records(lab)
        yield lab
        return
    reason = netns_refusal()
    if reason is not None:
        pytest.skip(reason)
    tag = secrets.token_hex(3)
    lab = Lab({n: f"brt{tag}-{n}" for n in ["hub", *NODES]})
    tmp = tmp_path_factory.mktemp("lab")
    try:
        _build(lab)
        lab.capture = tmp / "relay.capture"
        relay_addr = f"{lab.addr('relay')}:7400"
        lab.relay = start_relay(
            tmp / "relay",
            "--listen",
            relay_addr,
            "--capture",
            str(lab.capture),
            prefix=lab.exec_prefix("relay"),
        )
        for node in ("s1", "s2", "s3"):
            listen = "0.0.0.0" if node == "s3" else lab.addr(node)
            lab.servers[node] = start_server(
                tmp / node,
                "--listen",
                f"{listen}:7000",
                "--relay",
                relay_addr,
                prefix=lab.exec_prefix(node),
            )
        yield lab
    finally:
        _teardown(lab)
