"""Path-discovery messages ("disco", after Tailscale's and Iroh's): PING, PONG, CALL_ME_MAYBE.

They travel beside the QUIC datagrams -- through the relay (CALL_ME_MAYBE) and on the direct
socket (PING, PONG) -- and decide where a relayed peer's QUIC datagrams go. An attacker who
could forge a PONG could redirect a session's traffic to an address it owns, so every message
is signed with the sender's Ed25519 node key (the peer id is that key) and names its
recipient: a message is accepted only from the peer it claims to come from and only by the
peer it was meant for. A PONG also echoes the random transaction id of the PING it answers,
so only a PING we sent recently can be answered.

Wire form (all fixed fields, then the body, then the signature)::

    MAGIC(8) type(1) sender(32) recipient(32) txid(12) body signature(64)

The first byte of MAGIC has neither QUIC header bit set, so a disco message can never be
taken for a QUIC packet (RFC 9000 17.2-17.3), wherever the two share a socket or a tunnel.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ed25519

from ..addressing import Address, format_host_port, parse_host_port
from ..transport import Identity, PeerId

MAGIC = b"\x00brdisco"
"""Opens every disco message; its first byte is not a QUIC header (no 0x80 or 0x40 bit)."""
CONTEXT = b"burn-remote-disco/1"
"""Prepended to what is signed, so a disco signature is good for nothing else."""
PING, PONG, CALL_ME_MAYBE = 0x01, 0x02, 0x03
TXID = 12
"""Bytes of a transaction id: random, so a PONG cannot be guessed."""
SIGNATURE = 64
HEAD = len(MAGIC) + 1 + 32 + 32 + TXID
PING_PADDING = 64
"""A PING's body is this many zero bytes: at least the longest PONG body (an observed IPv6
``[host%scope]:port``), so a PONG is never larger than the PING that caused it and a forged
source address gains no amplification."""
MAX_CANDIDATES = 8
"""Addresses one CALL_ME_MAYBE may list."""
MAX_MESSAGE = HEAD + 512 + SIGNATURE
"""Longest disco message accepted; anything longer is dropped unread."""


class DiscoRefused(ValueError):
    """A datagram that looked like a disco message but is not a valid one for us."""


@dataclass(frozen=True)
class Disco:
    """One verified disco message."""

    kind: int
    sender: PeerId
    txid: bytes
    body: bytes

    @property
    def candidates(self) -> list[tuple[str, int]]:
        """CALL_ME_MAYBE: the sender's addresses (unparseable ones are skipped)."""
        out = []
        for text in self.body.decode(errors="replace").split(",")[:MAX_CANDIDATES]:
            try:
                out.append(parse_host_port(text))
            except ValueError:
                continue
        return out

    @property
    def observed(self) -> str:
        """PONG: the address the PING came from, as its recipient saw it."""
        return self.body.decode(errors="replace")


def is_disco(data: bytes) -> bool:
    return data[: len(MAGIC)] == MAGIC


def new_txid() -> bytes:
    return secrets.token_bytes(TXID)


def encode(identity: Identity, kind: int, recipient: PeerId, txid: bytes, body: bytes) -> bytes:
    """A signed disco message from ``identity`` to ``recipient``."""
    head = MAGIC + bytes([kind]) + identity.peer_id.raw + recipient.raw + txid
    message = head + body
    return message + identity.private_key.sign(CONTEXT + message)


def ping(identity: Identity, recipient: PeerId, txid: bytes) -> bytes:
    return encode(identity, PING, recipient, txid, bytes(PING_PADDING))


def pong(identity: Identity, recipient: PeerId, txid: bytes, source: Address) -> bytes:
    body = format_host_port(source[0], source[1]).encode()[:PING_PADDING]
    return encode(identity, PONG, recipient, txid, body)


def call_me_maybe(
    identity: Identity, recipient: PeerId, candidates: list[tuple[str, int]]
) -> bytes:
    body = ",".join(format_host_port(h, p) for h, p in candidates[:MAX_CANDIDATES])
    return encode(identity, CALL_ME_MAYBE, recipient, new_txid(), body.encode())


def decode(data: bytes, me: PeerId) -> Disco:
    """The message in ``data``, checked: addressed to ``me``, signed by its sender.

    Raises:
        DiscoRefused: wrong size, unknown type, another recipient, or a bad signature.
    """
    if not is_disco(data) or not HEAD + SIGNATURE <= len(data) <= MAX_MESSAGE:
        raise DiscoRefused("not a disco message of an acceptable size")
    kind = data[len(MAGIC)]
    if kind not in (PING, PONG, CALL_ME_MAYBE):
        raise DiscoRefused(f"unknown disco type {kind}")
    at = len(MAGIC) + 1
    try:
        sender = PeerId(data[at : at + 32])
    except ValueError as exc:
        raise DiscoRefused(f"bad sender: {exc}") from None
    if data[at + 32 : at + 64] != me.raw:
        raise DiscoRefused("addressed to another peer")
    message, signature = data[:-SIGNATURE], data[-SIGNATURE:]
    try:
        key = ed25519.Ed25519PublicKey.from_public_bytes(sender.raw)
        key.verify(signature, CONTEXT + message)
    except (InvalidSignature, ValueError):
        raise DiscoRefused(f"bad signature (claims to be {sender})") from None
    return Disco(kind, sender, data[at + 64 : HEAD], message[HEAD:])


__all__ = [
    "CALL_ME_MAYBE",
    "MAX_CANDIDATES",
    "PING",
    "PONG",
    "Disco",
    "DiscoRefused",
    "call_me_maybe",
    "decode",
    "is_disco",
    "new_txid",
    "ping",
    "pong",
]
