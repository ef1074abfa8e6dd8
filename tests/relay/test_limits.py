"""The relay's per-peer limits, driven without sockets through :class:`RelayState`."""

from __future__ import annotations

import subprocess
import sys

import pytest
from burn_remote.protocol.relay import _wire as w
from burn_remote.protocol.transport import Identity
from burn_remote.server._relay import RelayState
from burn_remote.server._relay_limits import CONTROL_BURST, MIB, RelayLimits, TokenBucket

NOW = 1_700_000_000.0


def _register(relay: RelayState, me: Identity, addr: tuple, now: float = NOW) -> None:
    ((challenge, _),) = relay.handle(bytes([w.HELLO]) + me.peer_id.raw, addr, now)
    relay_peer, nonce = challenge[1:33], challenge[33:65]
    sig = me.private_key.sign(w.auth_message(relay_peer, nonce))
    ((ok, _),) = relay.handle(bytes([w.AUTH]) + me.peer_id.raw + sig, addr, now)
    assert ok[0] == w.OK, ok


def _send(relay: RelayState, src: tuple, dest: Identity, size: int, now: float) -> bool:
    out = relay.handle(bytes([w.SEND]) + dest.peer_id.raw + bytes(size), src, now)
    return bool(out) and out[0][0][0] == w.RECV


def test_a_flooding_peer_is_held_to_its_bandwidth_while_another_peer_flows() -> None:
    limits = RelayLimits(peer_bandwidth=1 * MIB, peer_datagram_rate=0, control_rate=0)
    relay = RelayState(Identity.generate(), limits=limits)
    flood, calm, sink = Identity.generate(), Identity.generate(), Identity.generate()
    fa, ca, sa = ("10.0.0.1", 1), ("10.0.0.2", 1), ("10.0.0.3", 1)
    for who, addr in ((flood, fa), (calm, ca), (sink, sa)):
        _register(relay, who, addr)
    size, passed_flood, passed_calm, calm_sent = 8192, 0, 0, 0
    # Two simulated seconds: the flooder offers 64 MiB/s, the calm peer 256 KiB/s.
    for tick in range(2000):
        now = NOW + tick / 1000
        for _ in range(8):
            passed_flood += size * _send(relay, fa, sink, size, now)
        if tick % 32 == 0:
            calm_sent += size
            passed_calm += size * _send(relay, ca, sink, size, now)
    burst = 0.25 * MIB
    assert passed_flood <= 1 * MIB * 2 + burst  # rate x time + one bucket, whatever was offered
    assert passed_flood >= 1 * MIB * 2 - size  # ...and the limit is a rate, not a cut-off
    assert passed_calm == calm_sent  # the other peer never lost a datagram
    assert relay.stats.limited > 0 and relay.stats.limited_bytes >= relay.stats.limited * size


def test_datagram_rate_bounds_a_flood_of_small_datagrams() -> None:
    limits = RelayLimits(peer_bandwidth=0, peer_datagram_rate=1000, control_rate=0)
    relay = RelayState(Identity.generate(), limits=limits)
    flood, sink = Identity.generate(), Identity.generate()
    _register(relay, flood, ("10.0.0.1", 1))
    _register(relay, sink, ("10.0.0.3", 1))
    passed = sum(_send(relay, ("10.0.0.1", 1), sink, 1, NOW + i / 100_000) for i in range(100_000))
    assert 1000 <= passed <= 1000 + 250  # one second at 1000/s, plus a quarter-second bucket


def test_control_requests_are_limited_per_source_address() -> None:
    relay = RelayState(Identity.generate(), limits=RelayLimits(control_rate=20))
    me = Identity.generate()
    hello = bytes([w.HELLO]) + me.peer_id.raw
    answered = sum(bool(relay.handle(hello, ("10.0.0.1", 5), NOW)) for _ in range(1000))
    assert answered == CONTROL_BURST
    assert relay.handle(hello, ("10.0.0.2", 5), NOW)  # another address is still answered
    assert relay.handle(hello, ("10.0.0.1", 5), NOW + 1.0)  # and the flooder, once it slows
    assert relay.stats.limited == 1000 - CONTROL_BURST


def test_token_bucket_zero_rate_never_refuses_and_a_huge_datagram_passes_a_full_bucket() -> None:
    off = TokenBucket(0, NOW)
    assert all(off.take(1 << 30, NOW) for _ in range(10))
    small = TokenBucket(1000, NOW)  # holds 250 bytes
    assert small.take(65536, NOW)  # full: one oversized datagram may pass...
    assert not small.take(65536, NOW)  # ...then it is empty
    assert not small.take(1, NOW + 0.0001)


@pytest.mark.parametrize("flag", ["--peer-bandwidth", "--peer-datagrams", "--control-rate"])
def test_relay_refuses_a_negative_or_non_numeric_limit(flag: str) -> None:
    for bad in ("-1", "lots", "inf"):
        done = subprocess.run(
            [sys.executable, "-m", "burn_remote.server.cli", "relay", flag, bad],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, done.stderr
        assert flag in done.stderr and bad in done.stderr
