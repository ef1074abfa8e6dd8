"""The soak harness's core (bench/soak.py) for a short run against a real server: one
client of every kind at once (captured and uncaptured MLPs, an item() loop checked against
NumPy, 8-16 MiB uploads read back byte for byte, generate checked against the local CPU, a
LoRA job) makes progress with no error, the server counts every session in /metrics while
they run and none after, and leaves no fd or thread behind. Times are not asserted: the
figures are bench/soak.py's to print."""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from burn_remote import RemoteDevice

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import soak  # noqa: E402

LEAK_SLACK = 2
"""fds or threads an idle server may hold beyond its idle count before the run (a pool
that grew by a worker under six concurrent sessions is not a leak; a leak per session or
per upload would be many)."""


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_soak_every_kind_progresses_without_errors_or_leaks(spawn, tmp_path: Path) -> None:
    server = spawn("--http", "0")
    assert server.http, server.output()
    report = soak.run_soak(
        server, tmp_path / "soak", sessions=len(soak.KINDS), seconds=12.0, warmup=4.0,
        every=2.0, bulk_mib=(8, 16),
    )  # fmt: skip
    assert report.errors == [], report.errors
    assert sorted(c.kind for c in report.clients) == sorted(soak.KINDS)
    stalled = [(c.kind, c.progress) for c in report.clients if c.progress == 0]
    assert stalled == [], stalled
    assert all(c.latencies for c in report.clients if c.kind == "item")
    assert max(s.sessions for s in report.samples) == len(soak.KINDS), report.samples
    assert report.idle_after.sessions == 0
    before, after = report.idle_before, report.idle_after
    assert after.fds <= before.fds + LEAK_SLACK, (before, after)
    assert after.threads <= before.threads + LEAK_SLACK, (before, after)
    # the server still answers: health, and a fresh session's step
    assert urllib.request.urlopen(f"{server.http}/healthz", timeout=10).status == 200
    dev = RemoteDevice(server.target)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert dev.tensor(x).sum().item() == float(x.sum())
    dev.close()


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.timeout(120)
def test_a_running_server_hands_back_the_heap_its_dropped_tensors_left(spawn) -> None:
    """Tensors of many sizes uploaded and dropped by a session that stays open: the free
    heap memory malloc kept for them goes back to the kernel within a few checks
    (``_daemon.TRIM_EVERY``), not only when the session closes."""
    import time

    from burn_remote.server import _daemon

    server = spawn()
    pid = server.proc.pid
    dev = RemoteDevice(server.target)
    rng = np.random.default_rng(0)
    base = _rss(pid)
    kept = [dev.tensor(np.ones(int(n), np.float32)) for n in rng.integers(1, 7, 40) * 2**20]
    dev.sync()
    loaded = _rss(pid)
    assert loaded > base + 300 * 2**20  # 40 tensors of 4-24 MiB (from malloc's heap)
    del kept
    dev.sync()
    deadline = time.monotonic() + 6 * _daemon.TRIM_EVERY
    while _rss(pid) > base + 150 * 2**20 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _rss(pid) <= base + 150 * 2**20, (base >> 20, loaded >> 20, _rss(pid) >> 20)
    assert dev.tensor(np.arange(4, dtype=np.float32)).sum().item() == 6.0  # still serving
    dev.close()
