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


class RecordStore:
    """The relay's table: newest valid record per peer, bounded in size."""

    def __init__(self, max_records: int = 100_000) -> None:
        self.max_records = max_records
        self._records: dict[PeerId, AddressRecord] = {}

    def __len__(self) -> int:
        return len(self._records)

    def accept(self, rec: AddressRecord, now: float | None = None) -> None:
        """Store ``rec`` or raise :class:`RecordRefused` (unsigned, forged, stale, replayed)."""
        now = time.time() if now is None else now
        rec.verify(now)
        held = self._records.get(rec.peer)
        if held is not None and rec.seq <= held.seq:
            raise RecordRefused(
                f"record of {str(rec.peer)[:12]}... replayed: sequence {rec.seq} is not "
                f"newer than {held.seq}"
            )
        if held is None and len(self._records) >= self.max_records:
            self.expire(now)
            if len(self._records) >= self.max_records:
                raise RecordRefused("relay record table is full")
        self._records[rec.peer] = rec

    def get(self, peer: PeerId, now: float | None = None) -> AddressRecord | None:
        rec = self._records.get(peer)
        if rec is not None and rec.expired(time.time() if now is None else now):
            return None
        return rec

    def expire(self, now: float) -> None:
        """Forget expired records (kept past expiry only to refuse replays until then)."""
        for peer in [p for p, r in self._records.items() if r.expired(now)]:
            del self._records[peer]


__all__ = ["AddressRecord", "RecordRefused", "RecordStore"]
