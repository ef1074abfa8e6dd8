"""The relay's per-peer limits: what one peer may make the relay forward, and how often one
address may ask it something. Kept apart from the relay loop so that the CLI can show the
defaults without importing trio."""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20
PEER_BANDWIDTH = 32 * MIB
"""Bytes per second one peer may have forwarded (``--peer-bandwidth``, in MiB/s; 0: none).
A Python relay forwards a few hundred MiB/s at best: one peer gets a fair share, not all."""
PEER_DATAGRAM_RATE = 30_000
"""Datagrams per second one peer may have forwarded (``--peer-datagrams``; 0: none): small
datagrams cost the relay as much CPU as big ones, so bytes alone do not bound the work."""
HOST_BANDWIDTH = 64 * MIB
"""Bytes per second all peers registered from one IP address may have forwarded together
(``--host-bandwidth``, in MiB/s; 0: none): ids cost nothing to make, so a per-id limit alone
lets one host take as many shares as it makes ids. Twice a peer's: a NAT with a few peers
behind it still gets more than one share."""
HOST_DATAGRAM_RATE = 2 * 30_000
"""Datagrams per second all peers from one IP address may have forwarded together
(``--host-datagrams``; 0: none)."""
CONTROL_RATE = 20
"""Control requests (HELLO, AUTH, PUBLISH, LOOKUP, PING) per second from one source address
(``--control-rate``; 0: none). A signature check costs ~100 us: a flood of AUTHs would
otherwise keep the loop busy."""
BURST_SECONDS = 0.25
"""A peer's buckets hold this many seconds of their rate: QUIC's bursts pass, a flood
does not."""
CONTROL_BURST = 40
"""Control requests one address may send at once (a client's start-up: HELLO, AUTH,
PUBLISH, LOOKUPs, each retried once a second when lost)."""
HOST_CONTROL_RATE = 10 * CONTROL_RATE
"""Control requests per second from one IP address over all its ports: one host with many
source ports otherwise gets each port's rate (a NAT's peers share it, hence 10x)."""
HOST_CONTROL_BURST = 10 * CONTROL_BURST
"""Control requests one IP address may send at once (over all its ports)."""
MAX_CONTROL_SOURCES = 4096
"""Source addresses whose control rate is remembered at once (oldest forgotten first)."""
MAX_PEERS_PER_HOST = 64
"""Registered peers from one IP address (a NAT's peers share one); the relay holds as many
of its address records (``protocol/relay/_records.py``, ``MAX_RECORDS_PER_HOST``)."""
MAX_PEERS_PER_NET = 256
"""Registered peers from one /24 (IPv4) or /64 (IPv6), and as many records."""
MAX_NONCES_PER_HOST = 64
"""Outstanding challenges one IP address may have (its oldest forgotten first), so that one
host's HELLOs cannot push everyone else's challenges out."""
LIMIT_LOG_INTERVAL = 10.0
"""Seconds between two log lines about the same limited peer or address."""


@dataclass(frozen=True)
class RelayLimits:
    """Per-peer limits (0 turns one off); see the constants for the defaults' reasons."""

    peer_bandwidth: float = PEER_BANDWIDTH
    peer_datagram_rate: float = PEER_DATAGRAM_RATE
    control_rate: float = CONTROL_RATE
    host_bandwidth: float = HOST_BANDWIDTH
    host_datagram_rate: float = HOST_DATAGRAM_RATE

    def describe(self) -> str:
        def each(v: float, unit: str, scale: float = 1) -> str:
            return "unlimited" if v <= 0 else f"{v / scale:g} {unit}"

        return (
            f"per peer {each(self.peer_bandwidth, 'MiB/s', MIB)}, "
            f"{each(self.peer_datagram_rate, 'datagrams/s')}; "
            f"per IP address {each(self.host_bandwidth, 'MiB/s', MIB)}, "
            f"{each(self.host_datagram_rate, 'datagrams/s')}; "
            f"control {each(self.control_rate, 'requests/s')} per address"
        )


class TokenBucket:
    """``rate`` per second, up to ``burst`` saved (default ``rate * BURST_SECONDS``); rate 0
    never refuses."""

    __slots__ = ("rate", "cap", "tokens", "last")

    def __init__(self, rate: float, now: float, burst: float | None = None) -> None:
        self.rate = rate
        self.cap = max(rate * BURST_SECONDS if burst is None else burst, 1.0)
        self.tokens = self.cap
        self.last = now

    def can(self, amount: float, now: float) -> bool:
        """Refill to ``now``; whether ``amount`` may be taken (nothing is taken: two buckets
        charged for one datagram are both asked first, so a refusal costs neither)."""
        if self.rate <= 0:
            return True
        self.tokens = min(self.cap, self.tokens + max(0.0, now - self.last) * self.rate)
        self.last = now
        # (a datagram bigger than the whole bucket passes when it is full)
        return self.tokens >= amount or (amount > self.cap and self.tokens >= self.cap)

    def take(self, amount: float, now: float) -> bool:
        if not self.can(amount, now):
            return False
        if self.rate > 0:
            self.tokens -= amount
        return True


__all__ = [
    "BURST_SECONDS",
    "CONTROL_BURST",
    "CONTROL_RATE",
    "HOST_BANDWIDTH",
    "HOST_CONTROL_BURST",
    "HOST_CONTROL_RATE",
    "HOST_DATAGRAM_RATE",
    "MAX_NONCES_PER_HOST",
    "MAX_PEERS_PER_HOST",
    "MAX_PEERS_PER_NET",
    "MIB",
    "PEER_BANDWIDTH",
    "PEER_DATAGRAM_RATE",
    "RelayLimits",
    "TokenBucket",
]
