"""The relay's tables and budgets against one host making thousands of ids (keys cost
nothing), driven without sockets through :class:`RelayState` with a simulated clock: each
source (an IP address, and its /24 or /64) holds a bounded share, a real peer from elsewhere
still registers, publishes and is forwarded to, and bandwidth is held per source address as
well as per id."""

from __future__ import annotations

import pytest
from burn_remote.protocol.relay import AddressRecord, RecordStore
from burn_remote.protocol.relay import _records as records
from burn_remote.protocol.relay import _wire as w
from burn_remote.protocol.transport import Identity
from burn_remote.server import _relay_limits as relay_limits
from burn_remote.server import _relay_peers as peers
from burn_remote.server._relay import RelayState
from burn_remote.server._relay_limits import BURST_SECONDS, MIB, RelayLimits

from .test_limits import _register, _send

NOW = 1_700_000_000.0
FAKE_IDS = 10_000
"""Ids the attacker makes (the issue's attack registered 9,999)."""
PORTS = 200
"""Source ports the attacker spreads them over (as the issue's attack did)."""
ATTACKER = "203.0.113.7"
NEIGHBOUR = "203.0.113.8"
"""Another host of the attacker's /24."""
REAL = ("198.51.100.1", 4000)

UNLIMITED = RelayLimits(peer_bandwidth=0, peer_datagram_rate=0, control_rate=0,
                        host_bandwidth=0, host_datagram_rate=0)  # fmt: skip
"""The flood tests are about the tables, not the rates (a real flood also meets those)."""


def _auth(relay: RelayState, me: Identity, addr: tuple, now: float = NOW) -> bytes:
    """HELLO and AUTH for ``me`` from ``addr``; the relay's answer to the AUTH."""
    ((challenge, _),) = relay.handle(bytes([w.HELLO]) + me.peer_id.raw, addr, now)
    sig = me.private_key.sign(w.auth_message(challenge[1:33], challenge[33:65]))
    ((answer, _),) = relay.handle(bytes([w.AUTH]) + me.peer_id.raw + sig, addr, now)
    return answer


def _publish(relay: RelayState, me: Identity, addr: tuple, now: float = NOW) -> bytes:
    rec = AddressRecord.create(me, ["192.0.2.1:7000"], ttl=records.MAX_TTL, now=now)
    ((answer, _),) = relay.handle(bytes([w.PUBLISH]) + rec.encode(), addr, now)
    return answer


@pytest.fixture(scope="module")
def fake_keys() -> list[Identity]:
    return [Identity.generate() for _ in range(FAKE_IDS)]


def test_ten_thousand_fake_ids_from_one_address_leave_room_for_a_real_peer(fake_keys) -> None:
    relay = RelayState(Identity.generate(), limits=UNLIMITED)
    answers = [_auth(relay, key, (ATTACKER, 1000 + i % PORTS)) for i, key in enumerate(fake_keys)]
    # a port's new id replaces its last one, so the host holds one id per port it has
    # a slot for, however many it makes
    refused = [a for a in answers if a[0] == w.ERR]
    assert refused and b"too many peers registered from 203.0.113.7" in refused[-1]
    assert relay.peers.on_host(ATTACKER) <= relay_limits.MAX_PEERS_PER_HOST
    assert len(relay.peers) <= relay_limits.MAX_PEERS_PER_HOST  # one id per port left, at most
    # its /24 neighbour still gets its share, and the real peer registers and publishes
    assert _auth(relay, Identity.generate(), (NEIGHBOUR, 1)) == bytes([w.OK]) + b"registered"
    real = Identity.generate()
    assert _auth(relay, real, REAL) == bytes([w.OK]) + b"registered"
    assert _publish(relay, real, REAL) == bytes([w.OK]) + b"stored"
    assert relay.store.get(real.peer_id, NOW) is not None
    # and a registered fake can reach it through the relay (the table works, not just holds)
    sender = next(key for key in reversed(fake_keys) if key.peer_id in relay.peers)
    addr = relay.peers.get(sender.peer_id).addr
    assert _send(relay, addr, real, 100, NOW)


def test_one_network_holds_a_bounded_share() -> None:
    relay = RelayState(Identity.generate(), limits=UNLIMITED)
    hosts = relay_limits.MAX_PEERS_PER_NET // relay_limits.MAX_PEERS_PER_HOST + 2
    ok = 0
    for h in range(hosts):
        for p in range(relay_limits.MAX_PEERS_PER_HOST):
            ok += _auth(relay, Identity.generate(), (f"203.0.113.{10 + h}", p))[0] == w.OK
    assert ok == relay_limits.MAX_PEERS_PER_NET
    answer = _auth(relay, Identity.generate(), ("203.0.113.200", 1))
    assert b"too many peers registered from 203.0.113.0/24" in answer
    assert _auth(relay, Identity.generate(), ("203.0.114.1", 1))[0] == w.OK  # the next /24
    v6 = [_auth(relay, Identity.generate(), (f"2001:db8::{i:x}", 1)) for i in range(300)]
    assert sum(a[0] == w.OK for a in v6) == relay_limits.MAX_PEERS_PER_NET  # one /64
    assert _auth(relay, Identity.generate(), ("2001:db8:0:1::1", 1))[0] == w.OK


def test_idle_registrations_of_a_host_make_room_for_its_new_ones() -> None:
    relay = RelayState(Identity.generate(), limits=UNLIMITED)
    for p in range(relay_limits.MAX_PEERS_PER_HOST):
        assert _auth(relay, Identity.generate(), (ATTACKER, p))[0] == w.OK
    assert _auth(relay, Identity.generate(), (ATTACKER, 999))[0] == w.ERR
    later = NOW + peers.REGISTRATION_TTL + 1  # nobody pinged: all idle
    assert _auth(relay, Identity.generate(), (ATTACKER, 999), later)[0] == w.OK
    assert relay.peers.on_host(ATTACKER) == 1


def test_an_auth_for_a_new_key_from_a_registered_address_replaces_the_old_entry() -> None:
    relay = RelayState(Identity.generate(), limits=UNLIMITED)
    old, new, other = Identity.generate(), Identity.generate(), Identity.generate()
    _register(relay, old, (ATTACKER, 1))
    _register(relay, other, REAL)
    _register(relay, new, (ATTACKER, 1))
    assert old.peer_id not in relay.peers and new.peer_id in relay.peers
    assert len(relay.peers) == 2
    assert not _send(relay, REAL, old, 10, NOW)  # nothing routes to the replaced id
    assert _send(relay, REAL, new, 10, NOW)


def test_records_come_only_from_registered_peers_and_are_charged_to_their_source(
    fake_keys,
) -> None:
    """A host churns ids (each AUTH from a port replaces that port's last id) and publishes
    a 24-hour record for each: it keeps at most MAX_RECORDS_PER_HOST of them, the oldest of
    its no-longer-registered ids' records going first, and a real server still publishes
    in a table far smaller than the flood."""
    store = RecordStore(max_records=2_000)
    relay = RelayState(Identity.generate(), store=store, limits=UNLIMITED)
    stranger = Identity.generate()
    assert b"not registered" in _publish(relay, stranger, (ATTACKER, 1))
    ports = 16
    stored = 0
    for i, key in enumerate(fake_keys[:3_000]):
        addr = (ATTACKER, 5000 + i % ports)
        assert _auth(relay, key, addr)[0] == w.OK  # replaces the port's previous id
        stored += _publish(relay, key, addr)[0] == w.OK
    assert stored == 3_000  # every one accepted, each displacing an idle one of its own
    assert len(store) <= records.MAX_RECORDS_PER_HOST
    live = fake_keys[3_000 - ports : 3_000]
    assert all(store.get(k.peer_id, NOW) is not None for k in live)  # live peers' kept
    # someone else's record cannot be published by a registered peer
    me = fake_keys[2_999]
    forged = AddressRecord.create(stranger, ["192.0.2.9:1"], now=NOW)
    addr = relay.peers.get(me.peer_id).addr
    ((answer, _),) = relay.handle(bytes([w.PUBLISH]) + forged.encode(), addr, NOW)
    assert b"publishes only its own record" in answer
    real = Identity.generate()
    _register(relay, real, REAL)
    assert _publish(relay, real, REAL) == bytes([w.OK]) + b"stored"


def test_a_full_host_displaces_only_its_idle_peers_records() -> None:
    """A host at its record cap, every record a live peer's: a new id on one of its ports
    (which replaces that port's id) publishes by displacing the replaced id's record, and
    every live peer's record stays. (Registrations per host are capped at the records'
    cap, so a live peer always finds room.)"""
    assert relay_limits.MAX_PEERS_PER_HOST <= records.MAX_RECORDS_PER_HOST
    relay = RelayState(Identity.generate(), limits=UNLIMITED)
    keys = [Identity.generate() for _ in range(records.MAX_RECORDS_PER_HOST)]
    for p, key in enumerate(keys):
        _register(relay, key, (ATTACKER, p))
        assert _publish(relay, key, (ATTACKER, p))[0] == w.OK
    newcomer = Identity.generate()
    _register(relay, newcomer, (ATTACKER, 0))  # keys[0] is gone from the table: idle
    assert _publish(relay, newcomer, (ATTACKER, 0))[0] == w.OK
    assert relay.store.get(keys[0].peer_id, NOW) is None
    assert all(relay.store.get(k.peer_id, NOW) is not None for k in keys[1:])
    assert len(relay.store) == records.MAX_RECORDS_PER_HOST


def test_bandwidth_is_held_per_source_address_over_all_its_ids() -> None:
    """16 ids of one host each offer 8 MiB/s for two simulated seconds against a host limit
    of 1 MiB/s: together they get 1 MiB/s (plus one bucket), not 16 shares; a peer of
    another host loses nothing."""
    limits = RelayLimits(peer_bandwidth=1 * MIB, peer_datagram_rate=0, control_rate=0,
                         host_bandwidth=1 * MIB, host_datagram_rate=0)  # fmt: skip
    relay = RelayState(Identity.generate(), limits=limits)
    sink, calm = Identity.generate(), Identity.generate()
    _register(relay, sink, ("198.51.100.9", 1))
    _register(relay, calm, REAL)
    ids = [Identity.generate() for _ in range(16)]
    for p, key in enumerate(ids):
        _register(relay, key, (ATTACKER, p))
    size, passed, calm_sent, calm_passed = 8192, 0, 0, 0
    for tick in range(2000):
        now = NOW + tick / 1000
        for p in range(len(ids)):
            passed += size * _send(relay, (ATTACKER, p), sink, size, now)
        if tick % 32 == 0:
            calm_sent += size
            calm_passed += size * _send(relay, REAL, sink, size, now)
    assert passed <= 1 * MIB * 2 + BURST_SECONDS * MIB + size
    assert passed >= 1 * MIB * 2 - size  # a rate, not a cut-off
    assert calm_passed == calm_sent


def test_a_hello_flood_from_one_host_keeps_another_hosts_challenge() -> None:
    relay = RelayState(Identity.generate(), limits=UNLIMITED)
    me = Identity.generate()
    ((challenge, _),) = relay.handle(bytes([w.HELLO]) + me.peer_id.raw, REAL, NOW)
    for p in range(peers.MAX_NONCES + 100):  # every one a new source port
        relay.handle(bytes([w.HELLO]) + me.peer_id.raw, (ATTACKER, p), NOW)
    assert len(relay._nonces) <= peers.MAX_NONCES
    sig = me.private_key.sign(w.auth_message(challenge[1:33], challenge[33:65]))
    ((answer, _),) = relay.handle(bytes([w.AUTH]) + me.peer_id.raw + sig, REAL, NOW)
    assert answer == bytes([w.OK]) + b"registered"


def test_control_requests_are_limited_per_host_over_all_its_ports() -> None:
    from burn_remote.server._relay_limits import HOST_CONTROL_BURST

    relay = RelayState(Identity.generate(), limits=RelayLimits(control_rate=20))
    me = Identity.generate()
    hello = bytes([w.HELLO]) + me.peer_id.raw
    answered = sum(bool(relay.handle(hello, (ATTACKER, p), NOW)) for p in range(5_000))
    assert answered == HOST_CONTROL_BURST
    assert relay.handle(hello, REAL, NOW)  # another host is still answered
