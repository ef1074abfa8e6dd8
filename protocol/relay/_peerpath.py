"""Which way one relayed peer's datagrams go: the relay, or a direct path that answers pings.

Sans-I/O (times are passed in), so the decisions are tested without sockets. The rules,
after Iroh's magicsock:

* Candidates are the peer's addresses (local and reflexive, from its CALL_ME_MAYBE through
  the relay) plus any address an authenticated PING from it arrived from (what its NAT
  really maps it to). Each is pinged; a PONG that answers one of our PINGs from the very
  address we pinged validates that address.
* A validated address is used while its last PONG is at most :data:`PATH_TRUST` old; it is
  pinged every :data:`HEARTBEAT` to stay so. When it goes quiet, datagrams go back to the
  relay -- QUIC above retransmits whatever the dead path swallowed, so nothing is lost.
* Punching pings every candidate each :data:`PUNCH_INTERVAL` for :data:`PUNCH_WINDOW` after
  the candidates arrive (both sides at once, so both NATs open), then each
  :data:`RETRY_INTERVAL`, so that a path that comes back is found again, until the peer has
  given no sign for :data:`GIVE_UP`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..addressing import Address, format_host_port

HEARTBEAT = 1.0
"""Seconds between pings of the path in use."""
PATH_TRUST = 3.5
"""Seconds a direct path stays in use after its last PONG (three heartbeats and a half)."""
PUNCH_INTERVAL = 0.5
"""Seconds between pings of each candidate while punching."""
PUNCH_WINDOW = 10.0
"""Seconds of fast punching after new candidates arrive."""
RETRY_INTERVAL = 5.0
"""Seconds between pings of each candidate outside the punching window."""
GIVE_UP = 60.0
"""Seconds after the last sign of the peer (a CALL_ME_MAYBE, PING or PONG) when pinging
stops: a peer that went away is not pinged for ever. Its next CALL_ME_MAYBE starts again."""
MAX_PENDING = 64
"""PINGs awaiting a PONG that are remembered (oldest forgotten first)."""
PING_LIFETIME = 5.0
"""Seconds a PING's transaction id can still be answered."""
HEARD_TTL = 30.0
"""Seconds an address stays accepted for incoming datagrams after an authenticated message
from it: the peer may already send directly while our own pings are still in flight."""
MAX_CANDIDATE_ADDRESSES = 16
"""Candidate addresses remembered per peer (the newest kept)."""
BETTER_RTT = 0.7
"""A second validated address replaces the one in use only if its round trip is below this
fraction of the current one: no flapping between two equal paths."""


@dataclass
class PeerPath:
    """Path state towards one peer."""

    candidates: dict[Address, float] = field(default_factory=dict)
    """Address -> when it was last offered or heard from."""
    pending: dict[bytes, tuple[Address, float]] = field(default_factory=dict)
    """PING txid -> (address pinged, when)."""
    heard: dict[Address, float] = field(default_factory=dict)
    """Address -> last authenticated message from the peer there."""
    best: Address | None = None
    best_pong: float = float("-inf")
    rtt: float = 0.0
    punch_since: float = float("-inf")
    last_ping: dict[Address, float] = field(default_factory=dict)
    reported: str = "relay"
    """The path last logged, so a change is logged once."""

    def add_candidates(self, addresses: list[Address], now: float) -> None:
        """New addresses from the peer: punch them now."""
        for addr in addresses:
            self.candidates[addr] = now
        self.punch_since = now
        self._trim(now)

    def _trim(self, now: float) -> None:
        while len(self.candidates) > MAX_CANDIDATE_ADDRESSES:
            del self.candidates[min(self.candidates, key=self.candidates.__getitem__)]
        for table in (self.heard,):
            for addr in [a for a, t in table.items() if now - t > HEARD_TTL]:
                del table[addr]

    def direct(self, now: float) -> Address | None:
        """Where to send now: the validated address, or None for the relay."""
        if self.best is not None and now - self.best_pong <= PATH_TRUST:
            return self.best
        return None

    def pings_due(self, now: float) -> list[Address]:
        """Addresses to ping now (each is then passed to :meth:`pinged`)."""
        if not self.active(now):
            return []
        current = self.direct(now)
        due = []
        for addr in self.candidates:
            if addr == current:
                interval = HEARTBEAT
            elif current is not None:
                interval = RETRY_INTERVAL
            elif now - self.punch_since <= PUNCH_WINDOW:
                interval = PUNCH_INTERVAL
            else:
                interval = RETRY_INTERVAL
            if now - self.last_ping.get(addr, float("-inf")) >= interval:
                due.append(addr)
        return due

    def active(self, now: float) -> bool:
        """Whether the peer gave a sign within :data:`GIVE_UP` (else nobody is pinged)."""
        last_sign = max(self.punch_since, max(self.heard.values(), default=float("-inf")))
        return now - last_sign <= GIVE_UP

    def pinged(self, addr: Address, txid: bytes, now: float) -> None:
        self.last_ping[addr] = now
        self.pending[txid] = (addr, now)
        while len(self.pending) > MAX_PENDING:
            del self.pending[next(iter(self.pending))]

    def on_ping(self, source: Address, now: float) -> None:
        """An authenticated PING from ``source``: accept datagrams from there, and ping it
        back (it is where the peer's NAT maps it towards us)."""
        self.heard[source] = now
        if source not in self.candidates:
            self.candidates[source] = now
            self.punch_since = now
            self._trim(now)

    def on_pong(self, txid: bytes, source: Address, now: float) -> bool:
        """An authenticated PONG: True when it answers one of our PINGs from the address
        that PING went to (that address is then validated)."""
        sent = self.pending.pop(txid, None)
        if sent is None or sent[0] != source or now - sent[1] > PING_LIFETIME:
            return False
        self.heard[source] = now
        rtt = now - sent[1]
        current = self.direct(now)
        if current is None or source == current or rtt < self.rtt * BETTER_RTT:
            self.best, self.best_pong, self.rtt = source, now, rtt
        return True

    def accepts(self, source: Address, now: float) -> bool:
        """Whether a datagram from ``source`` may be handed to QUIC as this peer's."""
        t = self.heard.get(source)
        return t is not None and now - t <= HEARD_TTL

    def describe(self, now: float) -> str:
        """``"direct host:port"`` or ``"relay"``: what ``dev.stats()`` and the logs show."""
        addr = self.direct(now)
        return "relay" if addr is None else f"direct {format_host_port(addr[0], addr[1])}"


__all__ = ["HEARTBEAT", "PATH_TRUST", "PeerPath"]
