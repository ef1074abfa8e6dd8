"""A link cut shorter than the grace period is invisible; a longer one says "session expired"."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from burn_remote import Device, RemoteDevice, RemoteError
from burn_remote.protocol.sequencing import unwrap, wrap
from burn_remote.protocol.transport.faultproxy import FaultProxy
from remote.mlp import train

pytestmark = [pytest.mark.timeout(150), pytest.mark.slow]


def _via_proxy(server, tmp_path, seed: int):  # type: ignore[no-untyped-def]
    host, port = server.address.rsplit(":", 1)
    proxy = FaultProxy.start_thread((host, int(port)), seed=seed)
    ph, pp = proxy.address
    return proxy, RemoteDevice(f"{server.peer_id}@{ph}:{pp}", key=tmp_path / "key")


def test_five_second_cut_mid_training_resumes_with_identical_weights(spawn, tmp_path) -> None:
    # A 1 s idle timeout makes both ends drop the QUIC connection during the cut, so the
    # client really reconnects and resumes (a cut under the idle timeout is plain QUIC loss).
    server = spawn("--idle-timeout", "1", "--resume-grace", "30")
    proxy, dev = _via_proxy(server, tmp_path, seed=3)
    cut_done = threading.Event()

    def on_step(step: int, _: int) -> None:
        if step == 2:
            proxy.cut(5.0)
            cut_done.set()

    try:
        got = train(dev, 6, on_step=on_step)
        stats = dev.stats()
        dev.close()
    finally:
        proxy.stop()
    want = train(Device.cpu(), 6)
    assert cut_done.is_set() and proxy.stats.cut > 0
    assert got["losses"] == want["losses"]
    for a, b in zip(got["weights"], want["weights"]):
        assert a.tobytes() == b.tobytes()
    assert stats["errors"] == 0


def test_cut_longer_than_grace_gives_session_expired(spawn, tmp_path) -> None:
    server = spawn("--idle-timeout", "1", "--resume-grace", "1")
    proxy, dev = _via_proxy(server, tmp_path, seed=4)
    try:
        x = dev.tensor(np.ones(4, np.float32))
        assert x.sum().item() == 4.0
        proxy.cut(5.0)
        with pytest.raises(RemoteError, match="session expired"):
            (x * 2).sum().item()
    finally:
        proxy.stop()


def test_sequenced_frames_round_trip_and_plain_frames_pass() -> None:
    assert unwrap(wrap(7, 3, b"\x91\x01")) == (7, 3, b"\x91\x01")
    assert unwrap(b"\x91\x01") is None


def test_server_applies_each_frame_once_and_resends_unacked() -> None:
    import trio
    from burn_remote.server._resume import SequencedControl

    class Pipe:
        def __init__(self) -> None:
            self.out: list[bytes] = []

        async def send_frame(self, f: bytes) -> None:
            self.out.append(f)

    sc = SequencedControl(Pipe())
    assert sc.accept(wrap(1, 0, b"a")) == b"a"
    assert sc.accept(wrap(1, 0, b"a")) is None  # resent after a reconnect: skipped
    assert sc.accept(wrap(2, 0, b"b")) == b"b"

    async def send() -> None:
        for x in (b"r1", b"r2", b"r3"):
            await sc.send_frame(x)

    trio.run(send)
    frames = sc.resend_after(1)  # the client saw r1 only
    assert frames is not None and [unwrap(f)[2] for f in frames] == [b"r2", b"r3"]
