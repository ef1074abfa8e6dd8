"""The resolver hook: how a bare peer id becomes an address when the address book is silent.

Resolvers are tried in the order added; the first address wins. After them, a configured
relay (``$BURN_REMOTE_RELAY`` or ``relay = "host:port"`` in the address book) is asked, so a
client needs no code to find a server that publishes its record there: that whole order is
``burn_remote.protocol.relay.resolve_peer``, above both packages. The hooks are kept here,
beside the transport, so that code adding one need not load the relay package. (The
async `Resolver` of _addressing serves `Endpoint.dial`; these synchronous lookups serve
`RemoteDevice`, which resolves before it dials.)
"""

from __future__ import annotations

from collections.abc import Callable

PeerLookup = Callable[[str], "tuple[str, int] | None"]
"""Peer id text -> (host, port) to dial, or None when this resolver does not know it."""

_resolvers: list[PeerLookup] = []


def add_resolver(fn: PeerLookup) -> None:
    """Try ``fn`` (before the relay) whenever a peer is not in the address book."""
    if fn not in _resolvers:
        _resolvers.append(fn)


def remove_resolver(fn: PeerLookup) -> None:
    """Stop trying ``fn`` (no error when it was never added)."""
    if fn in _resolvers:
        _resolvers.remove(fn)


def ask_resolvers(peer: str) -> tuple[str, int] | None:
    """The first address a hook knows for ``peer`` (hooks in the order added), else None."""
    for fn in list(_resolvers):
        addr = fn(peer)
        if addr is not None:
            return addr
    return None


__all__ = ["PeerLookup", "add_resolver", "ask_resolvers", "remove_resolver"]
