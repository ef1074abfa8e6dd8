"""Helpers for tests that run several real servers as one group (collectives, DataParallel):
servers that know each other's addresses, and a watchdog that turns a hang into a failure."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from burn_remote.server.testing import Daemon, start_daemon


def spawn_known(root: Path, started: list[Daemon], n: int, *flags: str) -> list[Daemon]:
    """n CPU servers under ``root``, each with the others in its address book (a server dials
    only peers it resolves itself); appended to ``started`` so the caller can stop them."""
    new = [
        start_daemon("serve", root / f"s{len(started) + k}", "--device", "cpu", *flags)
        for k in range(n)
    ]
    started.extend(new)
    for d in new:
        d.know(*[o for o in new if o is not d])
    return new


def bounded(fn: Callable[[], Any], seconds: float) -> Any:
    """``fn()`` on a thread: a hang fails the test after ``seconds`` instead of blocking the
    suite (a bound on a hang, not a timing assertion); an exception is raised here."""
    box: list[tuple[str, Any]] = []

    def run() -> None:
        try:
            box.append(("ok", fn()))
        except BaseException as exc:  # noqa: BLE001 - handed back to the test's thread
            box.append(("err", exc))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert box, f"hung for {seconds} s"
    kind, value = box[0]
    if kind == "err":
        raise value
    return value
