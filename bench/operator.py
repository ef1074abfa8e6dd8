"""A session's item() round trip with and without another session long-polling jobs, side by
side on one real server (the fix of issue 21: job polls run on job workers, never on the
network loop), and what the operator port costs: a /metrics scrape and a /healthz probe.

Run: .venv/bin/python bench/operator.py [--seconds S] [--repeats R]
Prints medians over R repeats of each phase's median and p99 item() time, and their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
from burn_remote import RemoteDevice
from burn_remote.server.testing import start_server


def _reads(x, seconds: float) -> list[float]:  # type: ignore[no-untyped-def]
    times = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        (x * 3).sum().item()
        times.append(time.perf_counter() - t0)
    return sorted(times)


def _poll(job, last: int, stop: threading.Event) -> None:  # type: ignore[no-untyped-def]
    while not stop.is_set():
        job.events(last)  # a long poll: waits WATCH_WAIT (2 s) for an event that never comes


def _p(times: list[float], q: float) -> float:
    return times[int(q * (len(times) - 1))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    os.environ["BURN_REMOTE_HOME"] = str(tmp / "home")
    (tmp / "home").mkdir()
    server = start_server(tmp / "server", "--data-dir", str(tmp / "data"), "--http", ":0")
    try:
        poller = RemoteDevice(server.target, key=tmp / "poller-key")
        garbage = tmp / "garbage.safetensors"
        garbage.write_bytes(b"not safetensors")
        ref = poller.jobs.upload(garbage)
        spec = {
            "kind": "lora_finetune", "seed": 7, "steps": 2, "batch_size": 4,
            "checkpoint_every": 1,
            "model": {"weights": ref, "n_head": 2},
            "data": {"path": ref},
            "lora": {"r": 4, "alpha": 8, "target_modules": ["c_attn"]},
        }  # fmt: skip
        job = poller.jobs.submit(spec)
        job.watch(progress=False, timeout=60)  # fails at once: no event will come again
        last = job.events(0)[-1]["seq"]
        reader = RemoteDevice(server.target, key=tmp / "reader-key")
        x = reader.tensor(np.ones(64, np.float32))
        (x * 3).sum().item()
        quiet, busy = [], []
        for _ in range(args.repeats):
            quiet.append(_reads(x, args.seconds))
            stop = threading.Event()
            t = threading.Thread(target=_poll, args=(job, last, stop), daemon=True)
            t.start()
            time.sleep(0.2)
            busy.append(_reads(x, args.seconds))
            stop.set()
            t.join(10)
        scrape = []
        for _ in range(20):
            t0 = time.perf_counter()
            urllib.request.urlopen(server.http + "/metrics", timeout=10).read()
            scrape.append(time.perf_counter() - t0)
    finally:
        server.stop()

    def med(phase: list[list[float]], q: float) -> float:
        return statistics.median(_p(t, q) for t in phase)

    print(f"item() over {args.seconds:g} s x {args.repeats} repeats (medians of each repeat)")
    print(f"{'':24}{'median ms':>10}{'p99 ms':>10}")
    for name, phase in (("alone", quiet), ("another session polls", busy)):
        print(f"{name:<24}{med(phase, 0.5) * 1e3:>10.2f}{med(phase, 0.99) * 1e3:>10.2f}")
    print(f"p99 ratio (polling / alone): {med(busy, 0.99) / med(quiet, 0.99):.2f}")
    print(f"/metrics scrape: median {statistics.median(scrape) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
