"""Signed address records and the relay's rules, without sockets."""

from __future__ import annotations

import dataclasses

import pytest
from burn_remote.protocol.relay import AddressRecord, RecordRefused, RecordStore
from burn_remote.protocol.relay import _wire as w
from burn_remote.protocol.transport import Identity
from burn_remote.server._relay import RelayState

from .test_limits import _register

NOW = 1_700_000_000.0


def test_valid_record_is_stored_and_round_trips() -> None:
    me = Identity.generate()
    rec = AddressRecord.create(me, ["10.0.0.1:7000"], "relay:7400", seq=5, ttl=60, now=NOW)
    back = AddressRecord.decode(rec.encode())
    assert back == rec
    store = RecordStore()
    store.accept(back, NOW + 1)
    assert store.get(me.peer_id, NOW + 1) == rec


def test_forged_unsigned_stale_replayed_records_are_refused() -> None:
    me, mallory = Identity.generate(), Identity.generate()
    store = RecordStore()
    good = AddressRecord.create(me, ["10.0.0.1:7000"], seq=10, ttl=60, now=NOW)
    store.accept(good, NOW)
    # Forged: mallory signs a record claiming to be me.
    signed_by_mallory = AddressRecord.create(mallory, ["6.6.6.6:1"], seq=11, ttl=60, now=NOW)
    forged = dataclasses.replace(signed_by_mallory, peer=me.peer_id)
    with pytest.raises(RecordRefused, match="bad signature"):
        store.accept(forged, NOW)
    # Altered: my signature, another address.
    altered = dataclasses.replace(good, addresses=("6.6.6.6:1",), seq=12)
    with pytest.raises(RecordRefused, match="bad signature"):
        store.accept(altered, NOW)
    # Unsigned.
    with pytest.raises(RecordRefused, match="unsigned"):
        store.accept(dataclasses.replace(good, signature=b"", seq=13), NOW)
    # Stale: a genuine record whose TTL ran out.
    old = AddressRecord.create(me, ["10.0.0.1:7000"], seq=14, ttl=60, now=NOW - 120)
    with pytest.raises(RecordRefused, match="stale"):
        store.accept(old, NOW)
    # Replayed: a genuine, fresh record, but not newer than the one held.
    with pytest.raises(RecordRefused, match="replayed"):
        store.accept(good, NOW)
    older = AddressRecord.create(me, ["6.6.6.6:1"], seq=9, ttl=60, now=NOW)
    with pytest.raises(RecordRefused, match="replayed"):
        store.accept(older, NOW)
    assert store.get(me.peer_id, NOW).addresses == ("10.0.0.1:7000",)


def test_relay_state_authenticates_by_challenge_and_forwards_by_peer_id() -> None:
    relay, a, b = Identity.generate(), Identity.generate(), Identity.generate()
    st = RelayState(relay)
    addr_a, addr_b = ("10.0.0.1", 1), ("10.0.0.2", 2)
    # Not registered: SEND is refused.
    ((reply, _),) = st.handle(bytes([w.SEND]) + b.peer_id.raw + b"x", addr_a, NOW)
    assert reply[0] == w.ERR
    # AUTH without a challenge, and with a wrong signature, are refused.
    sig = a.private_key.sign(b"whatever")
    ((reply, _),) = st.handle(bytes([w.AUTH]) + a.peer_id.raw + sig, addr_a, NOW)
    assert reply[0] == w.ERR
    for ident, addr in ((a, addr_a), (b, addr_b)):
        ((chal, _),) = st.handle(bytes([w.HELLO]) + ident.peer_id.raw, addr, NOW)
        nonce = chal[33:65]
        if ident is a:  # first a forged answer (signed by the wrong key), then a fresh HELLO
            bad = b.private_key.sign(w.auth_message(relay.peer_id.raw, nonce))
            ((reply, _),) = st.handle(bytes([w.AUTH]) + a.peer_id.raw + bad, addr, NOW)
            assert reply[0] == w.ERR
            ((chal, _),) = st.handle(bytes([w.HELLO]) + ident.peer_id.raw, addr, NOW)
            nonce = chal[33:65]
        good = ident.private_key.sign(w.auth_message(relay.peer_id.raw, nonce))
        ((reply, _),) = st.handle(bytes([w.AUTH]) + ident.peer_id.raw + good, addr, NOW)
        assert reply[0] == w.OK, reply
    ((out, dest),) = st.handle(bytes([w.SEND]) + b.peer_id.raw + b"opaque", addr_a, NOW)
    assert dest == addr_b and out == bytes([w.RECV]) + a.peer_id.raw + b"opaque"


def test_relay_state_refuses_bad_publish_with_reason() -> None:
    st = RelayState(Identity.generate())
    me = Identity.generate()
    rec = AddressRecord.create(me, ["1.2.3.4:5"], seq=1, ttl=60, now=NOW)
    ((err, _),) = st.handle(bytes([w.PUBLISH]) + rec.encode(), ("h", 1), NOW)
    assert err[0] == w.ERR and b"not registered" in err  # HELLO and AUTH first
    _register(st, me, ("h", 1), NOW)
    ((ok, _),) = st.handle(bytes([w.PUBLISH]) + rec.encode(), ("h", 1), NOW)
    assert ok[0] == w.OK
    ((err, _),) = st.handle(bytes([w.PUBLISH]) + rec.encode(), ("h", 1), NOW)
    assert err[0] == w.ERR and b"replayed" in err
    ((err, _),) = st.handle(bytes([w.PUBLISH]) + b"\x93garbage", ("h", 1), NOW)
    assert err[0] == w.ERR and b"malformed" in err
    ((rep, _),) = st.handle(bytes([w.LOOKUP]) + me.peer_id.raw, ("h", 1), NOW)
    assert rep[0] == w.RECORD and AddressRecord.decode(rep[1:]) == rec
