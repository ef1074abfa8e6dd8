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


__all__ = ["cut", "make_router", "nat_tool"]
