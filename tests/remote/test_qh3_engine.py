"""A RemoteDevice on the optional qh3 QUIC engine against a real (aioquic) server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from burn_remote import Device, RemoteDevice

from .conftest import Server
from .mlp import train

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def qh3_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("qh3")
    from burn_remote import _remote_link

    monkeypatch.setattr(_remote_link, "QUIC_ENGINE", "qh3")


def engine_of(dev: RemoteDevice) -> str:
    dev.sync()
    return type(dev._rec.runtime.link._conn._quic).__name__


def test_training_is_bitwise_equal_to_the_cpu_device(server: Server) -> None:
    dev = RemoteDevice(server.target)
    assert engine_of(dev) == "Qh3ClientConnection"
    remote = train(dev, 5)
    local = train(Device.cpu(), 5)
    assert remote["losses"] == local["losses"]
    for a, b in zip(remote["weights"], local["weights"]):
        assert a.tobytes() == b.tobytes()
    dev.close()


def test_a_bulk_tensor_goes_up_and_comes_back(server: Server) -> None:
    """Above the bulk threshold: chunks, BulkAcks and send back-pressure on qh3."""
    dev = RemoteDevice(server.target)
    x = np.random.default_rng(1).standard_normal(3 * 2**20).astype(np.float32)  # 12 MiB
    t = dev.tensor(x)
    np.testing.assert_array_equal((t * 2).numpy(), x * 2)
    assert engine_of(dev) == "Qh3ClientConnection"
    dev.close()


def test_an_unknown_engine_fails_the_device_with_its_name(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    from burn_remote import RemoteError, _remote_link

    monkeypatch.setattr(_remote_link, "QUIC_ENGINE", "quiche")
    dev = RemoteDevice(server.target)
    with pytest.raises(RemoteError, match="quic_engine 'quiche': expected one of aioquic, qh3"):
        dev.sync()


class _Core:
    """The two questions ``Qh3ClientConnection.get_timer`` asks qh3's compiled core."""

    def __init__(self, timer: tuple[str, float], queued: int = 0) -> None:
        self.timer, self.queued = timer, queued

    def get_timer(self) -> tuple[str, float]:
        return self.timer

    def get_send_buffer_size(self) -> int:
        return self.queued


def _policy(timer: tuple[str, float], *, queued: int = 0, confirmed: bool = True, got: int = 1):
    """A qh3 client connection over a stand-in core, after ``got`` bytes arrived at t=10."""
    from types import SimpleNamespace

    from burn_remote.protocol.transport._qh3 import Qh3ClientConnection

    conn = Qh3ClientConnection.__new__(Qh3ClientConnection)
    conn._quic = SimpleNamespace(
        _core=_Core(timer, queued),
        _handshake_confirmed=confirmed,
        receive_datagram=lambda data, addr, now: None,
    )
    conn._ack_since, conn._unacked_bytes = None, 0
    conn.receive_datagram(bytes(got), ("127.0.0.1", 1), 10.0)
    return conn


def test_an_idle_pacing_timer_waits_like_an_ack_and_paced_data_does_not() -> None:
    """qh3 paces ACK-only datagrams too: on a fresh loopback connection its pacer's slot
    (~0.5 ms) is longer than a round trip, so the ACK qh3 sends after every second reply
    made the next request wait. With nothing queued, its pacing timer waits ``ACK_DELAY``
    like an ACK (the ACK rides on the next request); stream data, the handshake and
    ``ACK_EVERY_BYTES`` unacknowledged keep qh3's time."""
    from burn_remote.protocol.transport._quic_fast import ACK_DELAY, ACK_EVERY_BYTES

    assert _policy(("pacing", 10.0004)).get_timer() == 10.0 + ACK_DELAY
    assert _policy(("ack_application", 10.001)).get_timer() == 10.0 + ACK_DELAY
    assert _policy(("pacing", 10.0004), queued=59).get_timer() == 10.0004
    assert _policy(("pacing", 10.0004), confirmed=False).get_timer() == 10.0004
    assert _policy(("pacing", 10.0004), got=ACK_EVERY_BYTES).get_timer() == 10.0004
    assert _policy(("ack_application", 10.001), got=ACK_EVERY_BYTES).get_timer() == 10.001
    assert _policy(("loss_detection", 10.03)).get_timer() == 10.03


def test_bulk_data_is_acknowledged_on_qh3s_time() -> None:
    """A reply-sized datagram's ACK waits ``ACK_DELAY`` (it rides on the next request); after
    a full datagram (a tensor read) qh3's own ACK time stands: held 20 ms, a server whose
    congestion window was small (slow start, after a loss) sent its window and waited, and
    a 4 MiB read through 1 % loss at 1350-byte datagrams took ~8 s instead of ~1 s."""
    from burn_remote.protocol.transport._qh3 import BULK_DATAGRAM
    from burn_remote.protocol.transport._quic_fast import ACK_DELAY

    assert (
        _policy(("ack_application", 10.001), got=BULK_DATAGRAM - 1).get_timer() == 10.0 + ACK_DELAY
    )
    assert _policy(("ack_application", 10.001), got=BULK_DATAGRAM).get_timer() == 10.001
    assert _policy(("pacing", 10.0004), got=BULK_DATAGRAM).get_timer() == 10.0004


def test_a_fresh_connection_sends_one_datagram_per_item(server: Server) -> None:
    """No ACK-only datagram in a request/reply loop on a fresh connection: each ACK rides
    on the next request (qh3 alone sent one after every second reply, ~1.2 per trip)."""
    dev = RemoteDevice(server.target)
    assert engine_of(dev) == "Qh3ClientConnection"
    quic = dev._rec.runtime.link._conn._quic
    sent = [0]
    inner = quic.datagrams_to_send

    def counted(now: float) -> list:
        out = inner(now)
        sent[0] += len(out)
        return out

    quic.datagrams_to_send = counted
    t = dev.tensor(np.ones(4, np.float32)).sum()
    assert t.item() == 4.0
    sent[0] = 0
    for _ in range(200):
        assert t.item() == 4.0
    assert sent[0] <= 210, f"{sent[0]} datagrams for 200 round trips"
    dev.close()


GOODBYE = """
import os, sys
import burn_remote as br
from burn_remote import _remote_link
from burn_remote.server.testing import start_server
srv = start_server(sys.argv[1])
_remote_link.QUIC_ENGINE = "qh3"
dev = br.RemoteDevice(srv.target)
dev.sync()
srv.stop()  # the server says goodbye first; this process exits at once
"""


def test_exiting_after_the_server_stopped_prints_no_traceback(tmp_path: Path) -> None:
    """The device's goodbye at exit found qh3's core closed by the server's CONNECTION_CLOSE
    before the reader thread saw it, and qh3's own exception escaped the atexit hook as a
    traceback on every such exit."""
    script = tmp_path / "goodbye.py"
    script.write_text(GOODBYE)
    env = {**os.environ, "BURN_REMOTE_HOME": str(tmp_path / "home")}
    for _ in range(2):  # the race is the usual outcome; twice makes a miss unlikely
        out = subprocess.run(
            [sys.executable, str(script), str(tmp_path / "srv")],
            capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr
