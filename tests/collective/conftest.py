"""Real `burn-remote serve` processes on loopback that know each other's addresses."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from burn_remote.server.testing import Daemon
from support.server_group import spawn_known


@pytest.fixture
def client_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "client-home"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("BURN_REMOTE_HOME", str(home))
    monkeypatch.delenv("BURN_REMOTE_KEY", raising=False)
    return home


@pytest.fixture
def servers(tmp_path: Path, client_home: Path) -> Iterator[Callable[..., list[Daemon]]]:
    """``servers(n, *flags)``: n CPU servers, each with the others in its address book (a
    server dials only peers it resolves itself)."""
    started: list[Daemon] = []

    def spawn(n: int, *flags: str) -> list[Daemon]:
        return spawn_known(tmp_path, started, n, *flags)

    yield spawn
    for d in started:
        d.stop()
