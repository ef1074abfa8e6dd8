"""Where one collective call's time goes besides the ring itself: the per-call timeline.

Starts N ``burn-remote serve --device cpu`` processes (``bench/allreduce.py``'s ``Ring``) and
times many small all-reduces (``collective.all_reduce`` on every rank, then
``collective.sync``), so the ring's own work is tiny and what shows is the per-call overhead
that a large all-reduce pays once per call and a data-parallel step once per step. One host,
one clock: the servers' debug log gives each rank's ``entered``/``done`` times, the client
stamps when it sent each rank's message. Medians over the calls, in ms from the first
``all_reduce`` call:

- sent r0 / sent last: rank 0's and the last rank's message handed to the transport;
- server latency: a rank's message sent -> its all-reduce entered (median over ranks);
- first in / last in / skew: the ranks entering their all-reduce;
- answers: the client has every rank's answer this long after the last rank finished;
- total: the whole call as the client sees it;
- CPU per call: each server (user + system, ns from /proc/*/task/*/schedstat) and this process.

Usage::

    .venv/bin/python bench/dispatch.py [--ranks 2 3] [--kib 64] [--calls 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import allreduce as bench  # noqa: E402


def _cpu_ns(pids: list[int]) -> int:
    """CPU nanoseconds the processes' threads have run (schedstat: finer than /proc/PID/stat's
    ticks, which a few-ms call cannot use)."""
    total = 0
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
            except OSError:  # the thread ended meanwhile
                pass
    return total


def measure(n: int, nbytes: int, calls: int) -> str:
    import numpy as np
    from burn_remote._remote import RemoteRuntime

    ring = bench.Ring(n, Path(tempfile.mkdtemp(prefix=f"dispatch{n}-")), "tcp")
    sent: list[tuple[int, float]] = []
    plain_send = RemoteRuntime.send

    def stamped_send(self: RemoteRuntime) -> None:
        plain_send(self)
        sent.append((id(self), time.time()))

    try:
        ring.check()
        for _ in range(10):  # warm: graphs registered, result buffers reused
            ring.time(nbytes)
        rank_of = {id(d._rt): k for k, d in enumerate(ring.devices)}
        xs = [d.tensor(np.ones(nbytes // 4, np.float32)) for d in ring.devices]
        ring.C.sync(ring.devices)
        calls_at: dict[int, tuple[float, float, dict[int, float]]] = {}
        pids = [d.proc.pid for d in ring.daemons]
        RemoteRuntime.send = stamped_send  # type: ignore[method-assign]
        c0, p0 = _cpu_ns(pids), time.process_time()
        for _ in range(calls):
            sent.clear()
            t0 = time.time()
            outs = [ring.C.all_reduce(x, ring.group, "sum") for x in xs]
            ring.C.sync(ring.devices)
            calls_at[ring.calls] = (
                t0,
                time.time(),
                {rank_of[i]: t for i, t in sent if i in rank_of},
            )
            ring.calls += 1
            del outs
            time.sleep(0.002)
        server_cpu = (_cpu_ns(pids) - c0) / 1e6 / calls / n
        client_cpu = (time.process_time() - p0) * 1e3 / calls
        RemoteRuntime.send = plain_send  # type: ignore[method-assign]
        time.sleep(0.5)  # the servers' last log lines
        spans = []
        for d in ring.daemons:
            found = {int(f.group(1)): (float(f.group(2)), float(f.group(3)))
                     for f in bench._SPAN.finditer(d.output())}  # fmt: skip
            spans.append(found)
        rows = []
        for seq, (t0, t1, at) in calls_at.items():
            if any(seq not in s for s in spans) or len(at) < n:
                continue
            entered = [s[seq][0] for s in spans]
            done = max(s[seq][1] for s in spans)
            rows.append((at[0] - t0, max(at.values()) - t0,
                         statistics.median(entered[k] - at[k] for k in range(n)),
                         min(entered) - t0, max(entered) - t0, max(entered) - min(entered),
                         t1 - done, t1 - t0))  # fmt: skip
    finally:
        RemoteRuntime.send = plain_send  # type: ignore[method-assign]
        ring.close()
    med = [statistics.median(r[k] for r in rows) * 1e3 for k in range(8)]
    return (f"{n:>5} {nbytes // 1024:>5} {len(rows):>5} " + " ".join(f"{v:>8.2f}" for v in med)
            + f" {server_cpu:>9.2f} {client_cpu:>9.2f}")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--kib", type=int, default=64, help="all-reduce size (small: overhead)")
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    home = tempfile.mkdtemp(prefix="bench-dispatch-")
    os.environ.setdefault("BURN_REMOTE_HOME", home)
    os.chmod(home, 0o700)
    print(f"cpus: {os.cpu_count()}  load {os.getloadavg()}  (medians, ms from the first call)")
    print(f"{'ranks':>5} {'KiB':>5} {'calls':>5} {'sent r0':>8} {'sent end':>8} {'srv lat':>8} "
          f"{'first in':>8} {'last in':>8} {'skew':>8} {'answers':>8} {'total':>8} "
          f"{'srv cpu':>9} {'cli cpu':>9}")  # fmt: skip
    for n in args.ranks:
        print(measure(n, args.kib * 1024, args.calls), flush=True)
    print(f"load {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
