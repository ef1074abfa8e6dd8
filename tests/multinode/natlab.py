"""NAT routers for the namespace labs, made with nft (else iptables): masquerading, with or
without random port mapping, a firewall that drops unsolicited datagrams to the router, and a
cut of the path between two routers (the relay stays reachable).

Random port mapping (``--random-fully``) gives every destination its own external port, as a
symmetric NAT does: the address the relay observes is then useless to anybody else, so hole
punching must fail and the relay must carry the session. The firewall also keeps Linux from
answering an early punch itself: without it the router would track that datagram as a flow
of its own, and the inside host's later mapping could no longer keep its port.
"""

from __future__ import annotations

import shutil
import subprocess

PUBLIC = "10.233.0"
RELAY, ROUTER_A, ROUTER_B = f"{PUBLIC}.1", f"{PUBLIC}.2", f"{PUBLIC}.3"
CLIENT, SERVER = "10.233.1.2", "10.233.2.2"
NODES = ("hub", "relay", "ra", "rb", "cli", "srv")
"""Namespaces of the two-NAT lab: the public hub (a bridge), the relay, router A with the
client behind it, router B with the server behind it."""


def nat_tool() -> str | None:
    """``"nft"`` or ``"iptables"``, whichever is installed (nft first), else None."""
    return next((t for t in ("nft", "iptables") if shutil.which(t)), None)


def _run(ns: str, *argv: str) -> None:
    subprocess.run(["ip", "netns", "exec", ns, *argv], check=True, capture_output=True, timeout=30)


def make_router(ns: str, *, random_ports: bool = False) -> None:
    """``ns`` masquerades what leaves its ``eth0`` and drops UDP sent to itself there."""
    if nat_tool() == "nft":
        masq = "masquerade random,fully-random" if random_ports else "masquerade"
        _run(ns, "nft", "add table ip nat")
        _run(ns, "nft", "add chain ip nat post { type nat hook postrouting priority srcnat; }")
        _run(ns, "nft", f"add rule ip nat post oifname eth0 {masq}")
        _run(ns, "nft", "add table ip fw")
        _run(ns, "nft", "add chain ip fw input { type filter hook input priority 0; }")
        _run(ns, "nft", "add rule ip fw input iifname eth0 meta l4proto udp drop")
    else:
        extra = ["--random-fully"] if random_ports else []
        _run(ns, "iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "eth0", "-j",
             "MASQUERADE", *extra)  # fmt: skip
        _run(ns, "iptables", "-A", "INPUT", "-i", "eth0", "-p", "udp", "-j", "DROP")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def _veth(a: str, a_if: str, b: str, b_if: str) -> None:
    _ip("-n", a, "link", "add", a_if, "type", "veth", "peer", "name", b_if, "netns", b)


def _link(ns: str, dev: str, addr: str) -> None:
    _ip("-n", ns, "addr", "add", addr, "dev", dev)
    _ip("-n", ns, "link", "set", dev, "up")


def build_two_nats(names: dict[str, str], *, random_ports: bool = False) -> None:
    """Make the namespaces ``names`` (keys: :data:`NODES`) into the two-NAT lab::

    hub bridge 10.233.0.0/24: relay .1, router A .2, router B .3
    router A 10.233.1.1 -- client 10.233.1.2    router B 10.233.2.1 -- server 10.233.2.2
    """
    for ns in names.values():
        _ip("netns", "add", ns)
        _ip("-n", ns, "link", "set", "lo", "up")
    hub = names["hub"]
    _ip("-n", hub, "link", "add", "br0", "type", "bridge")
    _ip("-n", hub, "link", "set", "br0", "up")
    for node, addr in (("relay", RELAY), ("ra", ROUTER_A), ("rb", ROUTER_B)):
        _veth(hub, f"v{node}", names[node], "eth0")
        _ip("-n", hub, "link", "set", f"v{node}", "master", "br0", "up")
        _link(names[node], "eth0", f"{addr}/24")
    for router, host, net, addr in (("ra", "cli", "10.233.1", CLIENT),
                                     ("rb", "srv", "10.233.2", SERVER)):  # fmt: skip
        r, h = names[router], names[host]
        _veth(r, "eth1", h, "eth0")
        _link(r, "eth1", f"{net}.1/24")
        _link(h, "eth0", f"{addr}/24")
        _ip("-n", h, "route", "add", "default", "via", f"{net}.1")
        _run(r, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        make_router(r, random_ports=random_ports)


def remove(names: dict[str, str]) -> None:
    for ns in names.values():
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def heal(ns: str) -> None:
    """Undo :func:`cut`."""
    if nat_tool() == "nft":
        _run(ns, "nft", "delete table ip pathcut")
    else:
        _run(ns, "iptables", "-F", "FORWARD")


def cut(ns: str, other: str) -> None:
    """Drop everything ``ns`` forwards to or from the address ``other``."""
    if nat_tool() == "nft":
        _run(ns, "nft", "add table ip pathcut")
        _run(ns, "nft", "add chain ip pathcut forward_cut { type filter hook forward priority 0; }")
        _run(ns, "nft", f"add rule ip pathcut forward_cut ip daddr {other} drop")
        _run(ns, "nft", f"add rule ip pathcut forward_cut ip saddr {other} drop")
    else:
        _run(ns, "iptables", "-I", "FORWARD", "-d", other, "-j", "DROP")
        _run(ns, "iptables", "-I", "FORWARD", "-s", other, "-j", "DROP")


__all__ = ["build_two_nats", "cut", "heal", "make_router", "nat_tool", "remove"]
