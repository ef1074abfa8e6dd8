"""A real `burn-remote serve` subprocess on loopback, and a client identity per test."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from burn_remote.server.testing import Daemon, start_daemon

Server = Daemon


def start_server(tmp: Path, *extra: str, prefix: tuple[str, ...] = ()) -> Daemon:
    return start_daemon("serve", tmp, "--device", "cpu", "--allow-any", *extra, prefix=prefix)


def stop_server(server: Daemon) -> None:
    server.stop()


@pytest.fixture(autouse=True)
def client_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "client-home"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("BURN_REMOTE_HOME", str(home))
    monkeypatch.delenv("BURN_REMOTE_KEY", raising=False)
    return home


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    started: list[Server] = []

    def _spawn(*extra: str) -> Server:
        s = start_server(tmp_path / f"server{len(started)}", *extra)
        started.append(s)
        return s

    yield _spawn
    for s in started:
        assert s.stop() == 0, s.output()


@pytest.fixture
def server(spawn: Callable[..., Server]) -> Server:
    return spawn()


def env_with_home(home: Path) -> dict[str, str]:
    return {**os.environ, "BURN_REMOTE_HOME": str(home)}
