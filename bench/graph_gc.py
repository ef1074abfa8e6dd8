"""Registering maximal graphs (``MAX_GRAPH_NODES`` nodes) while another thread wants the
interpreter: with CPython's default collector thresholds against the server's
(``server._daemon.GC_THRESHOLDS``), and its lock switch interval against the default.

Each variant runs in its own fresh interpreter (thresholds and heap start equal): a worker
thread registers GRAPHS distinct chains of additions through ``ServerState.register``, as a
RegisterGraph does, while the main thread sleeps 1 ms at a time and records how late it
wakes (what a network-loop turn sees). Reported per variant, medians over the rounds: the
registration time, the collector's full collections and their total and longest pause, and
the probe's median / p99 / max lateness. Ratios are default over server settings.

Run: .venv/bin/python bench/graph_gc.py [--graphs N] [--rounds R]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import gc, json, sys, threading, time
import msgpack
from burn_remote.protocol.graph import GRAPH_FORMAT, MAX_GRAPH_NODES, canonical, decode
from burn_remote.server._daemon import GC_THRESHOLDS, SWITCH_INTERVAL
from burn_remote.server._state import Limits, ServerState

graphs, server_settings = int(sys.argv[1]), sys.argv[2] == "server"
if server_settings:
    gc.set_threshold(*GC_THRESHOLDS)
    sys.setswitchinterval(SWITCH_INTERVAL)
state = ServerState("cpu", Limits(memory_limit=1 << 40))
work = []
for v in range(graphs):
    spec = [[1 + v], "float32"]
    nodes = [["add", [0, i], [], [spec]] for i in range(MAX_GRAPH_NODES)]
    raw = msgpack.packb([GRAPH_FORMAT, [spec], nodes, [MAX_GRAPH_NODES]])
    work.append((canonical(decode(raw)).digest(), raw))
del nodes
gc.collect()
pauses, start = [], [0.0]
def watch(phase, info):
    if phase == "start":
        start[0] = time.perf_counter()
    elif info["generation"] == 2:
        pauses.append(time.perf_counter() - start[0])
gc.callbacks.append(watch)
def register():
    for digest, raw in work:
        state.register(digest, raw)
t0 = time.perf_counter()
worker = threading.Thread(target=register)
worker.start()
late = []
while worker.is_alive():
    a = time.perf_counter()
    time.sleep(0.001)
    late.append(time.perf_counter() - a - 0.001)
took = time.perf_counter() - t0
late.sort()
print(json.dumps({
    "register_s": took, "full_gcs": len(pauses), "gc_s": sum(pauses),
    "gc_max_ms": 1e3 * max(pauses, default=0.0), "late_median_ms": 1e3 * late[len(late) // 2],
    "late_p99_ms": 1e3 * late[int(len(late) * 0.99)], "late_max_ms": 1e3 * late[-1],
}))
"""

KEYS = (
    "register_s",
    "full_gcs",
    "gc_s",
    "gc_max_ms",
    "late_median_ms",
    "late_p99_ms",
    "late_max_ms",
)


def run(graphs: int, variant: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(graphs), variant],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    got: dict[str, list[dict[str, float]]] = {"default": [], "server": []}
    for _ in range(args.rounds):  # interleaved: both variants see the same machine load
        for variant in got:
            got[variant].append(run(args.graphs, variant))
    med = {v: {k: statistics.median(r[k] for r in rows) for k in KEYS} for v, rows in got.items()}
    print(f"{args.graphs} graphs of 100 000 nodes, medians of {args.rounds} rounds")
    print(f"{'':16}{'default':>12}{'server':>12}{'ratio':>8}")
    for k in KEYS:
        d, s = med["default"][k], med["server"][k]
        ratio = f"{d / s:.1f}x" if s else "-"
        print(f"{k:16}{d:12.2f}{s:12.2f}{ratio:>8}")


if __name__ == "__main__":
    main()
