"""``serve --relay``: publish the server's record and take relayed clients into its port."""

from __future__ import annotations

from typing import Any

import trio

from ..protocol.relay import serve_via_relay
from ..protocol.relay._wire import addr_text


async def start_relay_agent(nursery: trio.Nursery, opts: Any, ep: Any) -> None:
    """Start :func:`serve_via_relay` for this endpoint; returns once the record is published."""
    host, port = ep.local_address[:2]
    addresses = list(opts.advertise or [])
    if not addresses and host not in ("0.0.0.0", "::"):
        addresses = [addr_text((host, port))]
    await nursery.start(
        lambda task_status: serve_via_relay(
            opts.identity, opts.relay, (host, port), addresses, task_status=task_status
        )
    )
    print(
        f"relay: {opts.relay} (record published: {', '.join(addresses) or 'relay only'})",
        flush=True,
    )
