"""The runner's side of fault injection across containers.

Faults are made from the host (`docker pause`, `docker network disconnect`, nftables rules
in a container's network namespace, `docker kill` + `docker start`), because a container
cannot do them to another. ``make compose-test`` (deploy/compose/run.py) shares a folder
with the runner (``$BURN_REMOTE_FAULTS``): a test writes ``NAME.json`` with the request,
the host writes ``NAME.started`` once the fault is in effect and ``NAME.done`` (JSON: what
it did and saw) once it is over.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

FAULTS_ENV = "BURN_REMOTE_FAULTS"
"""The folder shared with the host's fault injector; unset: no faults can be made."""
WAIT = 120.0
"""Seconds a test waits for the host to start or finish a fault."""


def fault_dir() -> Path | None:
    value = os.environ.get(FAULTS_ENV)
    return Path(value) if value else None


class Fault:
    """One request to the host, e.g. ``Fault("pause", "s1", seconds=10)``."""

    def __init__(self, action: str, service: str, **args: Any) -> None:
        folder = fault_dir()
        if folder is None:
            raise RuntimeError(f"${FAULTS_ENV} is not set: only make compose-test makes faults")
        self.name = f"{action}-{service}-{secrets.token_hex(3)}"
        self._base = folder / self.name
        request = {"action": action, "service": service, **args}
        tmp = self._base.with_suffix(".tmp")
        tmp.write_text(json.dumps(request))
        tmp.rename(self._base.with_suffix(".json"))  # the host sees it whole or not at all

    def _wait(self, suffix: str) -> dict[str, Any]:
        path = self._base.with_suffix(suffix)
        deadline = time.monotonic() + WAIT
        while not path.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the host did not answer fault {self.name} ({suffix})")
            time.sleep(0.05)
        answer = json.loads(path.read_text())  # written whole (deploy/compose/run.py _answer)
        if answer.get("error"):
            raise RuntimeError(f"fault {self.name} failed on the host: {answer['error']}")
        return answer

    def wait_started(self) -> dict[str, Any]:
        return self._wait(".started")

    def wait_done(self) -> dict[str, Any]:
        return self._wait(".done")
