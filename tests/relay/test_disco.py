"""Disco messages and path rules, without sockets: who may validate a direct path, and when
traffic goes back to the relay."""

from __future__ import annotations

import pytest
from burn_remote.protocol.relay import _disco as d
from burn_remote.protocol.relay._peerpath import (
    GIVE_UP,
    HEARD_TTL,
    PATH_TRUST,
    PING_LIFETIME,
    PUNCH_INTERVAL,
    PeerPath,
)
from burn_remote.protocol.transport import Identity

A, B = ("10.0.0.1", 4000), ("10.0.0.2", 5000)


def test_signed_messages_verify_and_tampering_is_refused() -> None:
    alice, bob, eve = Identity.generate(), Identity.generate(), Identity.generate()
    txid = d.new_txid()
    msg = d.decode(d.ping(alice, bob.peer_id, txid), bob.peer_id)
    assert (msg.kind, msg.sender, msg.txid) == (d.PING, alice.peer_id, txid)
    pong = d.pong(bob, alice.peer_id, txid, A)
    assert len(pong) <= len(d.ping(alice, bob.peer_id, txid))  # no amplification
    assert d.decode(pong, alice.peer_id).observed == "10.0.0.1:4000"
    cmm = d.decode(d.call_me_maybe(alice, bob.peer_id, [A, B]), bob.peer_id)
    assert cmm.candidates == [A, B]
    with pytest.raises(d.DiscoRefused, match="another peer"):
        d.decode(d.ping(alice, bob.peer_id, txid), eve.peer_id)
    forged = bytearray(d.pong(bob, alice.peer_id, txid, A))
    forged[-70] ^= 1  # the observed address, changed in flight
    with pytest.raises(d.DiscoRefused, match="bad signature"):
        d.decode(bytes(forged), alice.peer_id)
    # Eve signs a PONG with her key but claims Bob's id: refused.
    evil = bytearray(d.pong(eve, alice.peer_id, txid, A))
    evil[len(d.MAGIC) + 1 : len(d.MAGIC) + 33] = bob.peer_id.raw
    with pytest.raises(d.DiscoRefused, match="bad signature"):
        d.decode(bytes(evil), alice.peer_id)
    with pytest.raises(d.DiscoRefused, match="size"):
        d.decode(d.MAGIC + bytes(2000), alice.peer_id)


def test_only_a_pong_from_the_pinged_address_validates_it() -> None:
    path = PeerPath()
    path.add_candidates([A, B], now=0.0)
    assert path.pings_due(0.0) == [A, B]
    path.pinged(A, b"t1", 0.0)
    path.pinged(B, b"t2", 0.0)
    assert not path.on_pong(b"t1", ("6.6.6.6", 1), 0.01)  # answer from elsewhere: ignored
    assert not path.on_pong(b"t9", A, 0.01)  # no such ping
    assert path.direct(0.01) is None and not path.accepts(("6.6.6.6", 1), 0.01)
    assert path.on_pong(b"t2", B, 0.02)
    assert path.direct(0.02) == B and path.describe(0.02) == "direct 10.0.0.2:5000"
    assert path.accepts(B, 0.02)
    assert not path.on_pong(b"t2", B, 0.03)  # each ping is answered once


def test_a_quiet_path_falls_back_to_the_relay_and_late_pongs_do_not_count() -> None:
    path = PeerPath()
    path.add_candidates([A], now=0.0)
    path.pinged(A, b"t1", 0.0)
    assert path.on_pong(b"t1", A, 0.05)
    assert path.direct(0.05 + PATH_TRUST) == A
    assert path.direct(0.06 + PATH_TRUST) is None
    assert path.describe(0.06 + PATH_TRUST) == "relay"
    path.pinged(A, b"t2", 10.0)
    assert not path.on_pong(b"t2", A, 10.0 + PING_LIFETIME + 0.1)
    assert not path.accepts(A, 0.05 + HEARD_TTL + 1)


def test_punching_pings_fast_then_slowly_and_a_ping_adds_its_source() -> None:
    path = PeerPath()
    path.add_candidates([A], now=0.0)
    path.pinged(A, b"t1", 0.0)
    assert path.pings_due(PUNCH_INTERVAL / 2) == []
    assert path.pings_due(PUNCH_INTERVAL) == [A]
    path.on_ping(B, 0.7)  # the peer's NAT mapping towards us, not in its CALL_ME_MAYBE
    assert B in path.pings_due(0.7) and path.accepts(B, 0.7)
    for t in range(1, 30):
        for addr in path.pings_due(float(t)):
            path.pinged(addr, bytes([t]), float(t))
    # past the punching window: one ping per RETRY_INTERVAL (5 s; the last went at 25 s)
    assert path.pings_due(29.0) == [] and path.pings_due(30.0) == [A, B]
    assert path.pings_due(0.7 + GIVE_UP + 1) == []  # no sign of the peer for a minute
    path.add_candidates([A], now=100.0)  # it called again
    assert path.pings_due(100.0) == [A, B]
