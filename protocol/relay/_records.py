"""Signed address records: where a peer says it can be reached, in its own hand.

A record carries the peer's addresses, the relay it is registered with, a sequence number and
a lifetime, signed with the peer's Ed25519 key (the key *is* the peer id, so no certificate
authority is involved). A relay stores only records that verify, are not expired, and whose
sequence number is higher than the one it holds: a forged, stale or replayed record cannot
redirect anybody. Clients verify again what a relay hands them, so a lying relay can only
withhold records, never forge them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ed25519

from ..transport import Identity, PeerId

_CONTEXT = b"burn-remote-address-record/1"
MAX_ADDRESSES = 16
"""Addresses one record may list."""
MAX_TTL = 24 * 3600
"""Longest lifetime a record may claim (seconds)."""
CLOCK_SKEW = 300
"""Seconds a record's issue time may lie in the future before it is refused."""


class RecordRefused(ValueError):
    """A record failed verification or policy; the text says why."""


@dataclass(frozen=True)
class AddressRecord:
    """One peer's signed statement of where it can be reached."""

    peer: PeerId
    """Whose record this is; the signature must verify under this key."""
    addresses: tuple[str, ...]
    """``host:port`` strings at which the peer accepts QUIC directly."""
    relay: str
    """``host:port`` of the relay the peer is registered with ("" for none)."""
    seq: int
    """Strictly increasing per peer; a relay refuses anything not newer than what it holds."""
    issued: int
    """Unix time (seconds) the record was signed."""
    ttl: int
    """Seconds after ``issued`` the record stops being valid."""
    signature: bytes = b""
    """Ed25519 signature over the other fields (see :meth:`signed_bytes`)."""

    def signed_bytes(self) -> bytes:
        """The exact bytes the signature covers (context string first: no cross-protocol use)."""
        body = [_CONTEXT, self.peer.raw, list(self.addresses), self.relay, self.seq]
        return msgpack.packb([*body, self.issued, self.ttl], use_bin_type=True)

    @classmethod
    def create(
        cls,
        identity: Identity,
        addresses: tuple[str, ...] | list[str],
        relay: str = "",
        *,
        seq: int | None = None,
        ttl: int = 600,
        now: float | None = None,
    ) -> AddressRecord:
        """A record signed by ``identity``; ``seq`` defaults to the time in milliseconds,
        which keeps increasing across restarts without any state on disk."""
        now = time.time() if now is None else now
        rec = cls(
            identity.peer_id,
            tuple(addresses),
            relay,
            int(now * 1000) if seq is None else seq,
            int(now),
            ttl,
        )
        sig = identity.private_key.sign(rec.signed_bytes())
        return cls(rec.peer, rec.addresses, rec.relay, rec.seq, rec.issued, rec.ttl, sig)

    def encode(self) -> bytes:
        return msgpack.packb(
            [
                self.peer.raw,
                list(self.addresses),
                self.relay,
                self.seq,
                self.issued,
                self.ttl,
                self.signature,
            ],
            use_bin_type=True,
        )

    @classmethod
    def decode(cls, data: bytes) -> AddressRecord:
        """Parse (not verify) a record; raises :class:`RecordRefused` on malformed input."""
        try:
            f = msgpack.unpackb(data, raw=False, max_bin_len=4096, max_str_len=4096)
            peer, addrs, relay, seq, issued, ttl, sig = f
            ok = (
                isinstance(peer, bytes)
                and isinstance(addrs, list)
                and len(addrs) <= MAX_ADDRESSES
                and all(isinstance(a, str) for a in addrs)
                and isinstance(relay, str)
                and all(isinstance(v, int) and v >= 0 for v in (seq, issued, ttl))
                and isinstance(sig, bytes)
            )
            if not ok:
                raise ValueError("field types")
            return cls(PeerId(peer), tuple(addrs), relay, seq, issued, ttl, sig)
        except (ValueError, TypeError, msgpack.ExtraData, msgpack.UnpackException) as exc:
            raise RecordRefused(f"malformed address record: {exc}") from None

    def verify(self, now: float | None = None) -> None:
        """Raise :class:`RecordRefused` unless signed by ``peer``, fresh and well-formed."""
        if not self.signature:
            raise RecordRefused(f"record of {str(self.peer)[:12]}... is unsigned")
        try:
            key = ed25519.Ed25519PublicKey.from_public_bytes(self.peer.raw)
            key.verify(self.signature, self.signed_bytes())
        except (InvalidSignature, ValueError):
            raise RecordRefused(
                f"record of {str(self.peer)[:12]}...: bad signature (forged or altered)"
            ) from None
        now = time.time() if now is None else now
        if self.ttl > MAX_TTL:
            raise RecordRefused(f"record ttl {self.ttl} s exceeds {MAX_TTL} s")
        if self.issued > now + CLOCK_SKEW:
            raise RecordRefused("record issued in the future (clock skew?)")
        if self.issued + self.ttl < now:
            raise RecordRefused(
                f"record of {str(self.peer)[:12]}... is stale: expired "
                f"{int(now - self.issued - self.ttl)} s ago"
            )

    def expired(self, now: float) -> bool:
        return self.issued + self.ttl < now


MAX_RECORDS = 100_000
"""Records a relay holds at once."""
MAX_RECORDS_PER_HOST = 64
"""Records one IP address may have published that a relay still holds."""
MAX_RECORDS_PER_NET = 256
"""Records one network (the relay's unit: a /24 or /64) may have published that it holds."""


class RecordStore:
    """The relay's table: newest valid record per peer, bounded in size, in all and per
    source. ``accept`` takes the publisher's source (its IP address and network, as opaque
    strings) and charges the record to it; where a cap is reached, records of peers that
    are no longer registered (``idle``) go first, oldest first, then the record is refused.
    A record never displaces a live peer's."""

    def __init__(self, max_records: int = MAX_RECORDS) -> None:
        self.max_records = max_records
        self._records: dict[PeerId, AddressRecord] = {}
        """Oldest published first (a new record of a peer moves it to the end)."""
        self._source: dict[PeerId, tuple[str, str]] = {}
        self._by_host: dict[str, dict[PeerId, None]] = {}
        self._by_net: dict[str, dict[PeerId, None]] = {}

    def __len__(self) -> int:
        return len(self._records)

    def accept(
        self,
        rec: AddressRecord,
        now: float | None = None,
        source: tuple[str, str] = ("", ""),
        idle: Callable[[PeerId], bool] = lambda peer: True,
    ) -> None:
        """Store ``rec`` or raise :class:`RecordRefused` (unsigned, forged, stale, replayed,
        or its source or the table is full of live peers' records). ``source``: (host,
        network) of the publisher; ``idle(peer)``: whether a record's peer may lose it."""
        now = time.time() if now is None else now
        rec.verify(now)
        held = self._records.get(rec.peer)
        if held is not None and rec.seq <= held.seq:
            raise RecordRefused(
                f"record of {str(rec.peer)[:12]}... replayed: sequence {rec.seq} is not "
                f"newer than {held.seq}"
            )
        held_source = self._source.get(rec.peer, source)
        if held is not None:
            self._drop(rec.peer)  # the newer record replaces it (and moves to the end)
        host, net = source
        for group, cap, what in (
            (self._by_host.get(host, {}), MAX_RECORDS_PER_HOST, host),
            (self._by_net.get(net, {}), MAX_RECORDS_PER_NET, net),
            (self._records, self.max_records, ""),
        ):
            if len(group) >= cap and not self._make_room(list(group), now, idle):
                if held is not None:
                    self._put(rec.peer, held, held_source)
                where = f" from {what}" if what else ""
                raise RecordRefused(f"relay record table is full{where} (at most {cap})")
        self._put(rec.peer, rec, source)

    def _make_room(self, peers: list[PeerId], now: float, idle: Callable[[PeerId], bool]) -> bool:
        """Forget one of ``peers``' records: an expired one, else the oldest whose peer is
        idle; False if every one is live and valid."""
        for peer in peers:
            if self._records[peer].expired(now):
                self._drop(peer)
                return True
        for peer in peers:
            if idle(peer):
                self._drop(peer)
                return True
        return False

    def _put(self, peer: PeerId, rec: AddressRecord, source: tuple[str, str]) -> None:
        self._records[peer] = rec
        self._source[peer] = source
        self._by_host.setdefault(source[0], {})[peer] = None
        self._by_net.setdefault(source[1], {})[peer] = None

    def _drop(self, peer: PeerId) -> None:
        del self._records[peer]
        host, net = self._source.pop(peer)
        for table, key in ((self._by_host, host), (self._by_net, net)):
            group = table[key]
            del group[peer]
            if not group:
                del table[key]

    def get(self, peer: PeerId, now: float | None = None) -> AddressRecord | None:
        rec = self._records.get(peer)
        if rec is not None and rec.expired(time.time() if now is None else now):
            return None
        return rec

    def expire(self, now: float) -> None:
        """Forget expired records (kept past expiry only to refuse replays until then)."""
        for peer in [p for p, r in self._records.items() if r.expired(now)]:
            self._drop(peer)


__all__ = [
    "MAX_RECORDS",
    "MAX_RECORDS_PER_HOST",
    "MAX_RECORDS_PER_NET",
    "AddressRecord",
    "RecordRefused",
    "RecordStore",
]
