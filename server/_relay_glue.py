"""``serve --relay``: publish the server's record, take relayed clients into its port, and
reach other servers that only the relay knows how to reach (a move *from* a relayed server)."""

from __future__ import annotations

import os
import weakref
from typing import Any

import trio

from ..protocol.addressing import parse_host_port
from ..protocol.relay import RelayClient, RelayError, serve_via_relay
from ..protocol.relay._agent import PROBE_TIMEOUT_ENV
from ..protocol.relay._wire import addr_text
from ..protocol.transport import Connection, Endpoint, PeerId, PeerRejected, TransportError

_clients: weakref.WeakKeyDictionary[Endpoint, RelayClient] = weakref.WeakKeyDictionary()
"""The relay association each serving endpoint registered with."""


async def start_relay_agent(nursery: trio.Nursery, opts: Any, ep: Endpoint) -> None:
    """Start :func:`serve_via_relay` for this endpoint; returns once the record is published.

    The record lists ``--advertise`` exactly when it is given (the operator knows best);
    otherwise our listening address (unless it is a wildcard) and the address at which the
    relay sees our QUIC socket -- behind a NAT, the NAT's public mapping."""
    host, port = ep.local_address[:2]
    addresses = list(opts.advertise or [])
    if not addresses and host not in ("0.0.0.0", "::"):
        addresses = [addr_text((host, port))]
    discover = ep if not opts.advertise else None
    client = await nursery.start(
        lambda task_status: serve_via_relay(
            opts.identity,
            opts.relay,
            (host, port),
            addresses,
            endpoint=discover,
            punch=ep,
            task_status=task_status,
        )
    )
    _clients[ep] = client
    listed = [*addresses, *([client.observed] if client.observed not in (None, *addresses) else [])]
    seen = f"; the relay sees us at {client.observed}" if client.observed else ""
    print(
        f"relay: {opts.relay} (record published: {', '.join(listed) or 'relay only'}{seen})",
        flush=True,
    )


def has_relay(ep: Endpoint) -> bool:
    """Whether this serving endpoint is associated with a relay (``serve --relay``)."""
    return ep in _clients


async def connect_via_relay(ep: Endpoint, peer: str) -> Connection:
    """Dial ``peer`` found through our relay: the direct addresses of its signed record
    first (each gets ``$BURN_REMOTE_PROBE_TIMEOUT`` seconds, default 3), else the relay's
    tunnel. The last step of ``_peers.dial_peer``, for peers this server has no configured
    address of.

    Raises:
        TransportError: this server has no relay, the relay has no record, or no path works.
    """
    client = _clients.get(ep)
    if client is None:
        raise TransportError(
            f"the source {peer[:12]}... is reachable only through a relay, and this server "
            "was started without --relay"
        )
    pid = PeerId.parse(peer)
    try:
        record = await client.lookup(pid)
    except (RelayError, ValueError) as exc:
        raise TransportError(f"relay lookup of {peer[:12]}... failed: {exc}") from None
    if record is None:
        raise TransportError(f"the relay {client.relay} has no record of {peer[:12]}...")
    timeout = float(os.environ.get(PROBE_TIMEOUT_ENV, "3"))
    for text in record.addresses:
        try:
            addr = parse_host_port(text)
        except ValueError:
            continue
        with trio.move_on_after(timeout):
            try:
                return await ep.connect(pid, addr)
            except PeerRejected:
                raise
            except (TransportError, OSError):
                pass
    return await ep.connect(pid, await client.dial(pid))


async def record_addresses(ep: Endpoint, peer: PeerId) -> list[tuple[str, int]]:
    """The addresses in ``peer``'s signed record on our relay (none without a relay or a
    record): where a ring neighbour's own host may be found when our QUIC connection to it
    runs through a tunnel or a hole-punched path."""
    client = _clients.get(ep)
    if client is None:
        return []
    try:
        record = await client.lookup(peer)
    except (RelayError, ValueError, TransportError, OSError):
        return []
    found = []
    for text in record.addresses if record is not None else ():
        try:
            found.append(parse_host_port(text))
        except ValueError:
            continue
    return found


__all__ = ["connect_via_relay", "has_relay", "record_addresses", "start_relay_agent"]
