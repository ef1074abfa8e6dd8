"""Address discovery: a peer learns, from its QUIC socket, the address the relay sees it at
(STUN's reflexive address), and a server publishes it in its signed record."""

from __future__ import annotations

import numpy as np
import pytest
import trio
from burn_remote import RemoteDevice
from burn_remote.protocol.relay import RelayAgent, RelayError, observe_address
from burn_remote.protocol.relay import _wire as w
from burn_remote.protocol.relay._wire import parse_hostport
from burn_remote.protocol.transport import Endpoint, Identity, PeerId
from burn_remote.server._relay import RelayState
from remote.conftest import Server

pytestmark = pytest.mark.timeout(120)

NOW = 1_700_000_000.0


def test_relay_answers_observe_with_the_source_address_it_saw() -> None:
    relay = RelayState(Identity.generate())
    txid = bytes(range(w.TXID))
    ask = bytes([w.OBSERVE]) + txid + bytes(w.OBSERVE_MIN - w.TXID)
    ((answer, to),) = relay.handle(ask, ("203.0.113.7", 40001), NOW)
    assert to == ("203.0.113.7", 40001)
    assert answer == bytes([w.OBSERVED]) + txid + b"203.0.113.7:40001"
    ((answer6, _),) = relay.handle(ask, ("2001:db8::1", 5, 0, 0), NOW)
    assert answer6[1 + w.TXID :] == b"[2001:db8::1]:5"
    assert relay.stats.observed == 2


def test_relay_never_answers_observe_with_more_bytes_than_it_was_sent() -> None:
    relay = RelayState(Identity.generate())
    short = bytes([w.OBSERVE]) + bytes(w.TXID)  # unpadded: would amplify a forged source
    assert relay.handle(short, ("203.0.113.7", 1), NOW) == []
    long_v6 = ("fe80::1234:5678:9abc:def0%a-very-long-interface-name", 65535, 0, 0)
    ask = bytes([w.OBSERVE]) + bytes(w.OBSERVE_MIN)
    assert relay.handle(ask, long_v6, NOW) == []
    assert relay.stats.observed == 0


def test_endpoint_learns_its_address_from_the_relay_and_still_speaks_quic(
    relay: Server, spawn
) -> None:
    server = spawn()
    host, port = parse_hostport(server.address)

    async def main() -> tuple[str, tuple[str, int]]:
        async with Endpoint.open(Identity.generate(), bind=("127.0.0.1", 0)) as ep:
            seen = await observe_address(ep, parse_hostport(relay.address))
            conn = await ep.connect(PeerId.parse(server.peer_id), (host, port))
            await conn.close("done", flush_timeout=0.5)
            again = await observe_address(ep, parse_hostport(relay.address))
            assert again == seen
            return seen, ep.local_address

    seen, local = trio.run(main)
    assert seen == w.addr_text(local)  # no NAT on loopback: what the relay saw is our socket


def test_wildcard_server_publishes_the_address_the_relay_saw_and_is_dialled_directly(
    relay: Server, spawn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server on 0.0.0.0 has no address of its own to publish; the relay saw its QUIC
    socket at 127.0.0.1:PORT, so its record lists that and the client goes direct."""
    server = spawn("--relay", relay.address, "--listen", "0.0.0.0:0")
    port = parse_hostport(server.address)[1]
    assert f"the relay sees us at 127.0.0.1:{port}" in server.output()
    monkeypatch.setenv("BURN_REMOTE_RELAY", relay.address)
    record = RelayAgent.get(relay.address).lookup(PeerId.parse(server.peer_id))
    assert record is not None and record.addresses == (f"127.0.0.1:{port}",)
    dev = RemoteDevice(server.peer_id)
    assert dev.address == ("127.0.0.1", port)  # direct, not the relay tunnel
    assert dev.tensor(np.arange(5, dtype=np.float32)).sum().item() == 10.0
    dev.close()


def test_a_closed_relay_agent_stops_its_thread_and_says_so(relay: Server) -> None:
    """Without close an agent re-registers with its relay for the life of the process."""
    agent = RelayAgent.get(relay.address)
    assert agent.lookup(PeerId(bytes(32))) is None
    RelayAgent.close_all()
    assert not agent._thread.is_alive()
    with pytest.raises(RelayError, match="stopped"):
        agent.lookup(PeerId(bytes(32)))
    assert RelayAgent.get(relay.address) is not agent  # a later use starts a fresh one


def test_record_addresses_are_probed_at_once_and_the_first_that_answers_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A record now lists a local and a public address; probing them one after the other
    would cost one timeout each before the relay. They are probed together, and the record's
    order still decides among those that answer."""
    from burn_remote.protocol.relay import _agent

    live = {("10.0.0.2", 2), ("10.0.0.3", 3)}
    in_flight, most = 0, 0

    async def fake_probe(client: object, peer: object, address: tuple[str, int]) -> bool:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await trio.sleep(0.05)
        in_flight -= 1
        return address in live

    monkeypatch.setattr(_agent, "_probe", fake_probe)
    addrs = [("10.0.0.1", 1), ("10.0.0.2", 2), ("10.0.0.3", 3)]
    peer = Identity.generate().peer_id
    assert trio.run(_agent._first_reachable, None, peer, addrs) == ("10.0.0.2", 2)
    assert most == 3
    assert trio.run(_agent._first_reachable, None, peer, addrs[:1]) is None
