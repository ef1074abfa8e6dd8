"""The relay's datagram format: one type byte, then fixed fields, then a body.

Plain UDP, not QUIC: what the relay forwards *is* QUIC (already encrypted end to end), so a
second encryption layer would only cost. Control datagrams are small and retried by the
client; forwarded datagrams carry 33 bytes of header.

====  =========  ===============================================  ===========================
type  name       body                                             answer
====  =========  ===============================================  ===========================
0x01  HELLO      peer(32)                                         CHALLENGE
0x02  CHALLENGE  relay peer(32) nonce(32)                         AUTH
0x03  AUTH       peer(32) signature(64)                           OK / ERR
0x04  OK         text                                             --
0x05  ERR        text                                             --
0x06  PUBLISH    its own record (``_records``), when registered   OK / ERR
0x07  LOOKUP     peer(32)                                         RECORD / ERR
0x08  RECORD     record                                           --
0x09  PING       (none; refreshes a registration)                 OK
0x0A  OBSERVE    txid(12) padding (body >= 64 bytes)              OBSERVED
0x0B  OBSERVED   txid(12) "host:port" the request came from       --
0x10  SEND       destination peer(32) payload                     (forwarded as RECV)
0x11  RECV       source peer(32) payload                          --
====  =========  ===============================================  ===========================

OBSERVE is STUN's binding request: anyone may ask, and the answer is the source address the
relay saw, which behind a NAT is the NAT's public mapping of the asking socket (a peer asks
from its QUIC socket: see ``_observe``). The request is padded to at least the answer's size,
so that a forged source address gains an attacker no amplification.

AUTH signs ``AUTH_CONTEXT + relay peer + nonce``; the relay keeps each nonce for the address
it sent it to, once, so a signature is good for one relay, one challenge and one address.
"""

from __future__ import annotations

from ..addressing import SocketAddress, format_host_port, parse_host_port

HELLO, CHALLENGE, AUTH, OK, ERR = 0x01, 0x02, 0x03, 0x04, 0x05
PUBLISH, LOOKUP, RECORD, PING = 0x06, 0x07, 0x08, 0x09
OBSERVE, OBSERVED = 0x0A, 0x0B
SEND, RECV = 0x10, 0x11

TXID = 12
"""Bytes of an OBSERVE's transaction id (as STUN's), echoed in the answer."""
OBSERVE_MIN = 64
"""Smallest OBSERVE body the relay answers; an answer longer than its request (a long IPv6
address with a scope) is not sent at all."""

AUTH_CONTEXT = b"burn-remote-relay-auth/1"
HEADER = 33
"""Bytes a relayed datagram gains (type + peer id)."""


def auth_message(relay_peer: bytes, nonce: bytes) -> bytes:
    """What a peer signs to prove its key to the relay."""
    return AUTH_CONTEXT + relay_peer + nonce


def addr_text(addr: SocketAddress) -> str:
    return format_host_port(addr[0], addr[1])


parse_hostport = parse_host_port
"""The one ``host:port`` parser (``protocol/addressing.py``), under the name relay code used."""


__all__ = [
    "AUTH",
    "AUTH_CONTEXT",
    "CHALLENGE",
    "ERR",
    "HEADER",
    "HELLO",
    "LOOKUP",
    "OBSERVE",
    "OBSERVED",
    "OBSERVE_MIN",
    "OK",
    "PING",
    "PUBLISH",
    "RECORD",
    "RECV",
    "SEND",
    "TXID",
    "addr_text",
    "auth_message",
    "parse_hostport",
]
