"""A RemoteDevice on the optional qh3 QUIC engine against a real (aioquic) server."""

from __future__ import annotations

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
