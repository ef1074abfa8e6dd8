"""Load: N concurrent client sessions against one loopback server, each running a small graph
step after step and reading one scalar per step (a full round trip). Prints p50/p99 step
latency, throughput and errors. Bounded in sessions, steps and wall time; loopback only.

Run: .venv/bin/python bench/load.py [--sessions 50] [--steps 20] [--time-limit 120]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from burn_remote import RemoteDevice  # noqa: E402
from burn_remote import functional as F  # noqa: E402
from burn_remote.server.testing import start_server  # noqa: E402


def client(
    target: str, key: Path, steps: int, deadline: float, lat: list[float], errors: list[str]
) -> None:
    """One session: upload weights once, then steps of matmul+relu+sum with one read each."""
    try:
        dev = RemoteDevice(target, key=key)
        rng = np.random.default_rng(int.from_bytes(key.name.encode()[-4:], "little"))
        w = dev.tensor(rng.standard_normal((64, 64)).astype(np.float32))
        b = dev.tensor(rng.standard_normal(64).astype(np.float32))
        for _ in range(steps):
            if time.monotonic() > deadline:
                errors.append("time limit reached")
                break
            x = dev.tensor(rng.standard_normal((32, 64)).astype(np.float32))
            t0 = time.perf_counter()
            F.relu(x @ w + b).sum().item()
            lat.append(time.perf_counter() - t0)
        dev.close()
    except Exception as exc:  # counted and reported, the run goes on
        errors.append(f"{type(exc).__name__}: {exc}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=50)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--time-limit", type=float, default=120.0, metavar="SECONDS")
    args = ap.parse_args()
    sessions = max(1, min(args.sessions, 200))
    home = tempfile.mkdtemp(prefix="burn-remote-load-")
    os.chmod(home, 0o700)
    os.environ["BURN_REMOTE_HOME"] = home
    server = start_server(str(Path(home) / "server"))
    peer, addr = server.peer_id, server.address
    target = f"{peer}@{addr}"
    lat: list[float] = []
    errors: list[str] = []
    deadline = time.monotonic() + args.time_limit
    threads = [
        threading.Thread(
            target=client,
            args=(target, Path(home) / f"key{i:04d}", args.steps, deadline, lat, errors),
            daemon=True,
        )
        for i in range(sessions)
    ]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()) + 15)
    wall = time.perf_counter() - t0
    server.stop()
    if lat:
        q = statistics.quantiles(lat, n=100) if len(lat) > 1 else [lat[0]] * 99
        print(
            f"sessions {sessions}  steps {len(lat)}  wall {wall:.1f} s  "
            f"throughput {len(lat) / wall:.0f} steps/s"
        )
        print(
            f"step latency  p50 {q[49] * 1e3:.1f} ms  p99 {q[98] * 1e3:.1f} ms  "
            f"max {max(lat) * 1e3:.1f} ms"
        )
    print(f"errors {len(errors)}" + (f": {errors[:3]}" if errors else ""))


if __name__ == "__main__":
    main()
