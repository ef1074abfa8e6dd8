"""The resolver hook: how a bare peer id becomes an address when the address book is silent.

Resolvers are tried in the order added; the first address wins. After them, a configured
relay (``$BURN_REMOTE_RELAY`` or ``relay = "host:port"`` in the address book) is asked, so a
client needs no code to find a server that publishes its record there. Kept here, beside the
transport, so that the client and the relay package need not know about each other. (The
async `Resolver` of _addressing serves `Endpoint.dial`; these synchronous lookups serve
`RemoteDevice`, which resolves before it dials.)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

PeerLookup = Callable[[str], "tuple[str, int] | None"]
"""Peer id text -> (host, port) to dial, or None when this resolver does not know it."""

_resolvers: list[PeerLookup] = []


def add_resolver(fn: PeerLookup) -> None:
    """Try ``fn`` (before the relay) whenever a peer is not in the address book."""
    if fn not in _resolvers:
        _resolvers.append(fn)


def remove_resolver(fn: PeerLookup) -> None:
    if fn in _resolvers:
        _resolvers.remove(fn)


def resolve_peer(peer: str, key_path: str | Path | None = None) -> tuple[str, int] | None:
    """The address to dial ``peer`` at, from the hooks then the relay; None if nobody knows."""
    for fn in list(_resolvers):
        addr = fn(peer)
        if addr is not None:
            return addr
    from ..relay import resolve_via_relay  # lazy: only clients that need a relay load it

    return resolve_via_relay(peer, key_path=key_path)


__all__ = ["PeerLookup", "add_resolver", "remove_resolver", "resolve_peer"]
