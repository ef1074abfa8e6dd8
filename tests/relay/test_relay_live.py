"""A relay subprocess, a server that publishes to it, and clients that find it by peer id."""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pytest
import trio
from burn_remote import Device, RemoteDevice
from burn_remote.protocol.relay import AddressRecord, RecordRefused, RelayClient
from burn_remote.protocol.relay._wire import parse_hostport
from burn_remote.protocol.transport import Identity
from remote.conftest import Server
from remote.mlp import train

pytestmark = pytest.mark.timeout(120)

MARKER = b"PLAINTEXT-TENSOR"  # 16 recognisable bytes, repeated through a whole tensor


def _closed_port() -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize("engine", ["aioquic", "qh3"])  # the server's QUIC engine
def test_relay_path_when_direct_is_blocked_carries_no_plaintext(
    relay: Server, spawn, relay_capture, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    # The server advertises a dead direct address: the client's probe fails, so it must
    # tunnel through the relay.
    dead = f"127.0.0.1:{_closed_port()}"
    server = spawn("--relay", relay.address, "--advertise", dead, "--quic-engine", engine)
    monkeypatch.setenv("BURN_REMOTE_RELAY", relay.address)
    monkeypatch.setenv("BURN_REMOTE_PROBE_TIMEOUT", "1")
    dev = RemoteDevice(server.peer_id)  # no address, no address book: the relay resolves
    assert dev.address != parse_hostport(dead)
    pattern = np.frombuffer(MARKER * 4096, dtype=np.uint8)  # 64 KiB
    t = dev.tensor(pattern)
    assert t.numpy().tobytes() == pattern.tobytes()
    got = train(dev, 3)
    want = train(Device.cpu(), 3)
    assert got["losses"] == want["losses"]
    dev.close()
    seen = relay_capture()
    total = b"".join(seen)
    assert len(total) > pattern.nbytes  # the tensor did cross the relay...
    assert MARKER not in total  # ...but never in plain text
    assert MARKER[:8] not in total


def test_live_relay_refuses_forged_stale_replayed_publish(relay: Server) -> None:
    me, other = Identity.generate(), Identity.generate()

    async def main() -> None:
        async with RelayClient.open(me, parse_hostport(relay.address)) as client:
            good = AddressRecord.create(me, ["127.0.0.1:9"], relay.address, ttl=60)
            await client.publish(good)
            with pytest.raises(RecordRefused, match="replayed"):
                await client.publish(good)
            forged = AddressRecord.create(other, ["6.6.6.6:6"], seq=good.seq + 1, ttl=60)
            forged = AddressRecord(
                me.peer_id,
                *[
                    getattr(forged, f)
                    for f in ("addresses", "relay", "seq", "issued", "ttl", "signature")
                ],
            )
            with pytest.raises(RecordRefused, match="bad signature"):
                await client.publish(forged)
            stale = AddressRecord.create(
                me, ["127.0.0.1:9"], seq=good.seq + 2, ttl=10, now=good.issued - 100
            )
            with pytest.raises(RecordRefused, match="stale"):
                await client.publish(stale)
            rec = await client.lookup(me.peer_id)
            assert rec == good
            assert await client.lookup(other.peer_id) is None

    trio.run(main)


def test_resolves_direct_address_when_reachable(
    relay: Server, spawn, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    server = spawn("--relay", relay.address)  # advertises its real listening address
    monkeypatch.setenv("BURN_REMOTE_RELAY", relay.address)
    dev = RemoteDevice(server.peer_id)
    assert f"{dev.address[0]}:{dev.address[1]}" == server.address
    assert dev.tensor(np.arange(3, dtype=np.float32)).sum().item() == 3.0
    dev.close()


def test_tensor_moves_from_a_server_reachable_only_through_the_relay(
    relay: Server, spawn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client reaches the source through the relay (its direct address is dead), so the
    address it knows is its own end of the tunnel: the destination finds the source through
    its own relay association instead, and the bytes never pass through the client."""
    monkeypatch.setenv("BURN_REMOTE_PROBE_TIMEOUT", "1")  # also read by the servers below
    source = spawn("--relay", relay.address, "--advertise", f"127.0.0.1:{_closed_port()}")
    dest = spawn("--relay", relay.address)
    monkeypatch.setenv("BURN_REMOTE_RELAY", relay.address)
    src_dev = RemoteDevice(source.peer_id)
    assert f"{src_dev.address[0]}:{src_dev.address[1]}" != source.address  # tunnelled
    dest_dev = RemoteDevice(dest.target)
    data = np.random.default_rng(0).standard_normal((256, 300)).astype(np.float32)
    moved = src_dev.tensor(data).to(dest_dev)
    assert moved.device is dest_dev
    np.testing.assert_array_equal(moved.numpy(), data)
    np.testing.assert_array_equal((moved * 2).sum(0).numpy(), (data * 2).sum(0))
    src_dev.close()
    dest_dev.close()


def test_move_from_a_relayed_server_to_one_without_a_relay_says_why(
    relay: Server, spawn, monkeypatch: pytest.MonkeyPatch
) -> None:
    from burn_remote import OpFailed

    source = spawn("--relay", relay.address, "--advertise", f"127.0.0.1:{_closed_port()}")
    dest = spawn()  # no --relay: it cannot find a source that only the relay can reach
    monkeypatch.setenv("BURN_REMOTE_RELAY", relay.address)
    monkeypatch.setenv("BURN_REMOTE_PROBE_TIMEOUT", "1")
    src_dev, dest_dev = RemoteDevice(source.peer_id), RemoteDevice(dest.target)
    moved = src_dev.tensor(np.arange(4, dtype=np.float32)).to(dest_dev)
    with pytest.raises(OpFailed, match="knows no address of peer .* has no relay"):
        moved.numpy()
    np.testing.assert_array_equal(src_dev.tensor(np.ones(2, np.float32)).numpy(), np.ones(2))
    src_dev.close()
    dest_dev.close()
