"""The conformance suite's server: one real `burn-remote serve` per test module, with
small limits the tests reach (wire.py holds them), and a client that has said Hello."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from burn_remote.server.testing import Daemon, start_server

from .wire import MAX_FRAME, MAX_TENSORS, QUOTA, Raw


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("conformance")
    daemon = start_server(
        tmp / "server",
        "--max-frame", str(MAX_FRAME), "--session-memory", str(QUOTA),
        "--max-tensors", str(MAX_TENSORS), "--idle-timeout", "10", "--resume-grace", "30",
    )  # fmt: skip
    # --idle-timeout: 2 s once; a loaded machine (4 test workers on 2 cores) stalled a
    # connection past it, the server closed it and a JobStatus went unanswered
    yield daemon
    assert daemon.stop() == 0, daemon.output()


@pytest.fixture
def raw(server: Daemon, tmp_path: Path) -> Iterator[Raw]:
    client = Raw(server, tmp_path / "key")
    client.hello()
    yield client
    client.close()
