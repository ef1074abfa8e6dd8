"""A real `burn-remote relay` subprocess on loopback, beside the remote suite's fixtures."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from burn_remote.protocol.relay import RelayAgent
from burn_remote.server.testing import start_daemon
from remote.conftest import Server, client_home, spawn  # noqa: F401  (fixtures)


def start_relay(tmp: Path, *extra: str, prefix: tuple[str, ...] = ()) -> Server:
    """Start ``burn-remote relay`` (optionally under ``prefix``, e.g. ``ip netns exec``)."""
    return start_daemon("relay", tmp, *extra, prefix=prefix)


def stop_process(server: Server) -> str:
    """Stop a daemon; returns what it printed."""
    server.stop()
    return server.output()


@pytest.fixture(autouse=True)
def _relay_carries_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the relay itself: no hole punching (test_holepunch turns it
    back on), so what they send does cross the relay."""
    monkeypatch.setenv("BURN_REMOTE_DIRECT", "0")


@pytest.fixture(autouse=True)
def _close_relay_agents() -> Iterator[None]:
    """A test's clients are done with its relay when it ends: an agent left behind would
    re-register with the dead relay, logging a warning each round, for the rest of the run."""
    yield
    RelayAgent.close_all()


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[Server]:
    r = start_relay(
        tmp_path / "relay", "--listen", "127.0.0.1:0", "--capture", str(tmp_path / "relay.capture")
    )
    yield r
    stop_process(r)


@pytest.fixture
def relay_capture(tmp_path: Path) -> Callable[[], list[bytes]]:
    def read() -> list[bytes]:
        data = (tmp_path / "relay.capture").read_bytes()
        out, i = [], 0
        while i + 4 <= len(data):
            n = int.from_bytes(data[i : i + 4], "big")
            out.append(data[i + 4 : i + 4 + n])
            i += 4 + n
        return out

    return read
