"""A relay association outlives a network outage: sends that fail with ENETUNREACH (the
node's network is down, e.g. `docker network disconnect`) are retried, never fatal."""

from __future__ import annotations

import errno
from typing import Any

import pytest
import trio
from burn_remote.protocol.relay import RelayClient, RelayError
from burn_remote.protocol.relay import _client as relay_client
from burn_remote.protocol.relay._wire import parse_hostport
from burn_remote.protocol.transport import Identity
from remote.conftest import Server

pytestmark = pytest.mark.timeout(60)


class _Unplugged:
    """A relay socket whose sends fail with ENETUNREACH while ``down`` is set."""

    def __init__(self, sock: Any) -> None:
        self._sock, self.down, self.refused = sock, False, 0

    async def send(self, data: bytes) -> int:
        if self.down:
            self.refused += 1
            raise OSError(errno.ENETUNREACH, "Network is unreachable")
        return await self._sock.send(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def test_ping_loop_survives_an_unreachable_network(
    relay: Server, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(relay_client, "PING_INTERVAL", 0.05)
    monkeypatch.setattr(relay_client, "REQUEST_TIMEOUT", 0.05)
    me = Identity.load_or_create(tmp_path / "key")

    async def main() -> tuple[int, bool]:
        async with RelayClient.open(me, parse_hostport(relay.address)) as client:
            plug = client._sock = _Unplugged(client._sock)
            plug.down = True
            await trio.sleep(1.0)  # many ping rounds, every send refused
            with pytest.raises(RelayError, match="cannot send"):
                await client.lookup(me.peer_id)
            plug.down = False
            relay_client.REQUEST_TIMEOUT = 1.0  # a loaded machine may answer slowly
            await trio.sleep(0.5)  # the ping loop registers again
            record = await client.lookup(me.peer_id)  # the association works again
            return plug.refused, record is None

    refused, no_record = trio.run(main)
    assert refused > 4
    assert no_record  # nothing was published: the relay answered "unknown peer"
