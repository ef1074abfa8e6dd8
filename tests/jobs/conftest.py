"""Real `burn-remote serve` subprocesses (with --data-dir, so jobs are on) and a client home."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.jobs.models import make_base
from tests.remote.conftest import client_home, spawn  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny base GPT and its token dataset, made once per test file."""
    return make_base(tmp_path_factory.mktemp("base"))


def wait_for(predicate: Any, timeout: float = 30.0, every: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError("condition not met in time")
