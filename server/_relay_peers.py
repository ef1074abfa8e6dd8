"""The relay's registered peers and outstanding challenges, counted per source.

A peer id costs nothing to make (any fresh key signs its own challenge), so a table bounded
only in total is a table one host can fill. Here every entry is charged to its *source*: the
IP address it came from (any port) and that address's network (a /24 for IPv4, a /64 for
IPv6: what one customer of a provider usually holds). A source at its cap loses its own idle
entries first, then is refused; nobody else's entries are touched. An AUTH for a new key from
an address (IP and port) that is already registered replaces the old entry: one socket is one
peer.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from dataclasses import dataclass

from ..protocol.transport import PeerId
from ._relay_limits import MAX_NONCES_PER_HOST, MAX_PEERS_PER_HOST, MAX_PEERS_PER_NET

REGISTRATION_TTL = 60.0
"""Seconds a peer stays registered without a PING or a SEND (clients PING every 10 s)."""
MAX_PEERS = 10_000
"""Registered peers at once."""
MAX_NONCES = 4096
"""Outstanding challenges kept (oldest forgotten first)."""
IPV4_NET_BITS, IPV6_NET_BITS = 24, 64
"""Prefix lengths of a source's network."""


@dataclass(frozen=True)
class Source:
    """Who a datagram's address is charged to: its IP (``host``) and network (``net``)."""

    host: str
    net: str


def source_of(addr: tuple) -> Source:
    """The source of ``addr`` (an IPv4-mapped IPv6 address counts as IPv4; a name that is no
    IP address, as tests use, is its own host and network)."""
    text = str(addr[0]).split("%")[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return Source(text, text)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    bits = IPV4_NET_BITS if ip.version == 4 else IPV6_NET_BITS
    net = ipaddress.ip_network(f"{ip}/{bits}", strict=False)
    return Source(str(ip), str(net))


@dataclass
class Registration:
    addr: tuple
    seen: float
    source: Source


Gone = tuple[PeerId, Registration]
"""A peer the table forgot, and the entry it had."""


class PeerTable:
    """Registered peers: peer -> its address and when it was last heard, address -> peer,
    and how many each host and network holds."""

    def __init__(self) -> None:
        self._peers: dict[PeerId, Registration] = {}
        self._addrs: dict[tuple, PeerId] = {}
        self._by_host: dict[str, OrderedDict[PeerId, None]] = {}
        self._per_net: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._peers)

    def __contains__(self, peer: PeerId) -> bool:
        return peer in self._peers

    def get(self, peer: PeerId) -> Registration | None:
        return self._peers.get(peer)

    def at(self, addr: tuple) -> PeerId | None:
        """The peer registered at ``addr`` (IP and port), if any."""
        return self._addrs.get(addr)

    def live(self, peer: PeerId, now: float) -> bool:
        reg = self._peers.get(peer)
        return reg is not None and now - reg.seen <= REGISTRATION_TTL

    def on_host(self, host: str) -> int:
        """Peers registered from IP address ``host`` now."""
        return len(self._by_host.get(host, ()))

    def touch(self, peer: PeerId, now: float) -> None:
        reg = self._peers.get(peer)
        if reg is not None:
            reg.seen = now
            self._by_host[reg.source.host].move_to_end(peer)  # least recently heard first

    def register(self, peer: PeerId, addr: tuple, now: float) -> tuple[str, list[Gone]]:
        """Register ``peer`` at ``addr``: ("", the entries it removed) or (why not, those)."""
        removed: list[Gone] = []
        src = source_of(addr)
        old = self._addrs.get(addr)
        if old is not None and old != peer:  # a new key on this socket: one socket, one peer
            removed.append((old, self._remove(old)))
        if peer in self._peers:  # it moved (or re-authenticated): its old entry goes
            self._remove(peer)
        removed += self._make_room(src, now)
        why = ""
        if self.on_host(src.host) >= MAX_PEERS_PER_HOST:
            why = f"too many peers registered from {src.host} (at most {MAX_PEERS_PER_HOST})"
        elif self._per_net.get(src.net, 0) >= MAX_PEERS_PER_NET:
            why = f"too many peers registered from {src.net} (at most {MAX_PEERS_PER_NET})"
        elif len(self._peers) >= MAX_PEERS:
            why = "relay is full"
        if why:
            return why, removed
        self._peers[peer] = Registration(addr, now, src)
        self._addrs[addr] = peer
        self._by_host.setdefault(src.host, OrderedDict())[peer] = None
        self._per_net[src.net] = self._per_net.get(src.net, 0) + 1
        return "", removed

    def _make_room(self, src: Source, now: float) -> list[Gone]:
        """Forget idle peers (silent past REGISTRATION_TTL) where ``src`` would hit a cap:
        its host's first, then everyone's when its network or the table is full."""
        gone: list[Gone] = []
        if self.on_host(src.host) >= MAX_PEERS_PER_HOST:
            gone += self._expire(list(self._by_host.get(src.host, ())), now)
        if self._per_net.get(src.net, 0) >= MAX_PEERS_PER_NET or len(self._peers) >= MAX_PEERS:
            gone += self.expire(now)
        return gone

    def _expire(self, peers: list[PeerId], now: float) -> list[Gone]:
        return [(p, self._remove(p)) for p in peers if not self.live(p, now)]

    def expire(self, now: float) -> list[Gone]:
        """Forget every idle peer; returns them."""
        return self._expire(list(self._peers), now)

    def remove(self, peer: PeerId) -> Registration | None:
        """Forget ``peer``; its entry, if it had one."""
        return self._remove(peer) if peer in self._peers else None

    def _remove(self, peer: PeerId) -> Registration:
        reg = self._peers.pop(peer)
        if self._addrs.get(reg.addr) == peer:
            del self._addrs[reg.addr]
        on_host = self._by_host[reg.source.host]
        on_host.pop(peer, None)
        if not on_host:
            del self._by_host[reg.source.host]
        left = self._per_net[reg.source.net] - 1
        if left:
            self._per_net[reg.source.net] = left
        else:
            del self._per_net[reg.source.net]
        return reg


class Challenges:
    """Outstanding HELLO nonces, one per address, bounded in all and per host."""

    def __init__(self) -> None:
        self._nonces: OrderedDict[tuple, bytes] = OrderedDict()
        self._by_host: dict[str, OrderedDict[tuple, None]] = {}

    def __len__(self) -> int:
        return len(self._nonces)

    def put(self, addr: tuple, nonce: bytes) -> None:
        host = source_of(addr).host
        self.pop(addr)
        mine = self._by_host.setdefault(host, OrderedDict())
        if len(mine) >= MAX_NONCES_PER_HOST:
            self.pop(next(iter(mine)))
            mine = self._by_host.setdefault(host, OrderedDict())
        while len(self._nonces) >= MAX_NONCES:
            self.pop(next(iter(self._nonces)))
            mine = self._by_host.setdefault(host, OrderedDict())
        self._nonces[addr] = nonce
        mine[addr] = None

    def pop(self, addr: tuple) -> bytes | None:
        nonce = self._nonces.pop(addr, None)
        if nonce is not None:
            host = source_of(addr).host
            mine = self._by_host.get(host)
            if mine is not None:
                mine.pop(addr, None)
                if not mine:
                    del self._by_host[host]
        return nonce


__all__ = [
    "MAX_NONCES",
    "MAX_NONCES_PER_HOST",
    "MAX_PEERS",
    "MAX_PEERS_PER_HOST",
    "MAX_PEERS_PER_NET",
    "REGISTRATION_TTL",
    "Challenges",
    "PeerTable",
    "Registration",
    "Source",
    "source_of",
]
