"""Data-parallel speed-up: one transformer training step on one server vs `br.DataParallel`
over two servers, each server pinned to a core of its own (`os.sched_setaffinity`, as
`taskset -c` does).

One run, the variants interleaved round by round, medians over the rounds (this machine is
shared and noisy); the speed-up is also given as the median of each round's own ratio (the
two variants of a round ran seconds apart, under about the same load). The script holds
`/tmp/burn-bench.lock` (`flock`) while it measures, so two benchmarks never run at once, and
prints the load average beside every round. Both train the same GPT (AdamW, captured with `br.compile`) on the same
whole batches; DataParallel gives each server half of every batch and all-reduces the
gradients between the servers (the ring: on one host through shared memory), so the speed-up is what two
servers buy after the all-reduce and the client's waits. Every engine runs one BLAS thread,
so a server is one core's worth of work. The loss is read every step (as a training loop
that logs it does; DataParallel also waits for the replicas before each step to keep its
snapshot, see the README).

Run: .venv/bin/python bench/dataparallel.py [--steps N] [--rounds R] [--batch B] [--no-lock]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before NumPy loads; the servers inherit it

import burn_remote as br  # noqa: E402
import numpy as np  # noqa: E402
from burn_remote import nn, optim  # noqa: E402
from burn_remote.server.testing import Daemon, start_server  # noqa: E402

CONFIG = nn.GPTConfig(n_layer=4, n_head=4, d_model=192, vocab=256, context=128, dropout=0.0)
"""A step with enough work (batch 32 x 128 tokens: ~1 s on one core) that the all-reduce of
its gradients (~1.9M parameters, 7 MiB) is small beside it, as it is for the models data
parallelism is for."""


PIN = (
    "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])}); "
    "os.execv(sys.argv[2], sys.argv[2:])"
)
"""Run the rest of the command line pinned to core argv[1] (what `taskset -c` does; the
affinity is inherited by exec and by every thread the server starts)."""


def pinned(core: int) -> tuple[str, ...]:
    """A prefix that pins the server to `core` (`os.sched_setaffinity`), or nothing when the
    machine has no such core (said in the output)."""
    if not hasattr(os, "sched_setaffinity") or core not in os.sched_getaffinity(0):
        return ()
    return (sys.executable, "-c", PIN, str(core))


def shown(prefix: tuple[str, ...]) -> str:
    return f"core {prefix[-1]}" if prefix else "not pinned"


def build(batch: int, steps: int) -> tuple[Any, Any, list[tuple[np.ndarray, np.ndarray]]]:
    nn.seed(0)
    model = nn.GPT(CONFIG)
    opt = optim.AdamW(model, lr=1e-3)
    rng = np.random.default_rng(0)
    seqs = rng.integers(0, CONFIG.vocab, (steps, batch, CONFIG.context + 1))
    return model, opt, [(s[:, :-1], s[:, 1:]) for s in seqs]


def step(model: Any, opt: Any, x: Any, y: Any) -> Any:
    loss = model.loss(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def cpu_seconds(pid: int) -> float:
    """A server's CPU time so far (user + system, all threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(run: Any, batches: list, pids: list[int]) -> tuple[float, float]:
    """(median wall seconds per step, CPU seconds per step of the busiest server). The CPU
    figure is the work on the critical path: other processes on a shared machine stretch
    the wall time, not the CPU time."""
    before = [cpu_seconds(p) for p in pids]
    times = []
    for x, y in batches:
        t = time.perf_counter()
        run(x, y).item()
        times.append(time.perf_counter() - t)
    cpu = max(cpu_seconds(p) - b for p, b in zip(pids, before)) / len(batches)
    return statistics.median(times), cpu


def time_one(dev: Any, pid: int, batch: int, steps: int) -> tuple[float, float]:
    model, opt, batches = build(batch, steps + 2)
    model.to(dev)
    compiled = br.compile(lambda x, y: step(model, opt, x, y))

    def run(x: Any, y: Any) -> Any:
        return compiled(dev.tensor(x), dev.tensor(y))

    for x, y in batches[:2]:  # the captures
        run(x, y).item()
    return timed(run, batches[2:], [pid])


def time_parallel(
    devices: list[Any], pids: list[int], batch: int, steps: int, **opts: Any
) -> tuple[float, float]:
    model, opt, batches = build(batch, steps + 2)
    dp = br.DataParallel(model, opt, devices=devices, **opts)
    run = dp.compile(step)
    for x, y in batches[:2]:
        run(x, y).item()
    out = timed(run, batches[2:], pids)
    dp.close()
    return out


def fixed_costs(devices: list[Any], steps: int = 60) -> dict[str, float]:
    """Median ms per step of a step with almost no work (the digits MLP, batch 32): what
    DataParallel adds per step whatever the model (the ring's round trips, the waits)."""
    from burn_remote import functional as F

    def mlp() -> tuple[Any, Any]:
        nn.seed(0)
        net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
        return net, optim.AdamW(net.parameters(), lr=1e-3)

    def small_step(model: Any, opt: Any, x: Any, y: Any) -> Any:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    rng = np.random.default_rng(1)
    data = [
        (rng.standard_normal((32, 64)).astype(np.float32), rng.integers(0, 10, 32))
        for _ in range(steps)
    ]
    out = {}
    model, opt = mlp()
    model.to(devices[0])
    run = br.compile(lambda x, y: small_step(model, opt, x, y))
    times = []
    for x, y in data:
        t = time.perf_counter()
        run(devices[0].tensor(x), devices[0].tensor(y)).item()
        times.append(time.perf_counter() - t)
    out["1 server"] = statistics.median(times[5:])
    for name, every in (("2 servers", 1), ("2 servers, no snapshots", None)):
        model, opt = mlp()
        dp = br.DataParallel(model, opt, devices=devices, snapshot_every=every)
        step_dp = dp.compile(small_step)
        times = []
        for x, y in data:
            t = time.perf_counter()
            step_dp(x, y).item()
            times.append(time.perf_counter() - t)
        out[name] = statistics.median(times[5:])
        dp.close()
    return out


BENCH_LOCK = "/tmp/burn-bench.lock"
"""Held while measuring: benchmarks on this shared machine take turns."""


@contextlib.contextmanager
def bench_lock(path: str | None) -> Any:
    """`flock` on `path` (None: no lock), saying so when it has to wait."""
    if path is None:
        yield
        return
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for {path} (another benchmark is measuring)", flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f}/{five:.1f} (1/5 min) on {os.cpu_count()} cores"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3, help="timed steps per round and variant")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32, help="whole batch (each server: half)")
    ap.add_argument("--no-lock", action="store_true", help=f"measure without holding {BENCH_LOCK}")
    args = ap.parse_args()
    with bench_lock(None if args.no_lock else BENCH_LOCK):
        measure(args)


def measure(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-dp-"))
    os.environ["BURN_REMOTE_HOME"] = str(tmp / "client")
    (tmp / "client").mkdir(mode=0o700)
    prefixes = [pinned(0), pinned(1)]
    servers: list[Daemon] = [start_server(tmp / f"s{k}", prefix=p) for k, p in enumerate(prefixes)]
    try:
        servers[0].know(servers[1])
        servers[1].know(servers[0])
        devices = [br.RemoteDevice(s.target) for s in servers]
        print(
            f"GPT {CONFIG.n_layer}x{CONFIG.d_model}, context {CONFIG.context}, batch "
            f"{args.batch}; servers pinned: {', '.join(shown(p) for p in prefixes)}"
        )
        print(f"before: {load()}")
        pids = [srv.proc.pid for srv in servers]
        rows: dict[str, list[tuple[float, float]]] = {
            "1 server": [],
            "2 servers": [],
            "2 servers, no snapshots": [],
        }
        for r in range(args.rounds):
            rows["1 server"].append(time_one(devices[0], pids[0], args.batch, args.steps))
            rows["2 servers"].append(time_parallel(devices, pids, args.batch, args.steps))
            rows["2 servers, no snapshots"].append(
                time_parallel(devices, pids, args.batch, args.steps, snapshot_every=None)
            )
            print(
                f"round {r + 1}: "
                + "   ".join(
                    f"{n} {v[-1][0] * 1e3:7.1f} ms (server CPU {v[-1][1] * 1e3:6.1f} ms)"
                    for n, v in rows.items()
                )
                + f"   [{load()}]",
                flush=True,
            )
        wall = {n: statistics.median(t for t, _ in v) for n, v in rows.items()}
        cpu = {n: statistics.median(c for _, c in v) for n, v in rows.items()}
        one = "1 server"
        paired = {
            n: statistics.median(a[0] / b[0] for a, b in zip(rows[one], v))
            for n, v in rows.items()
            if n != one
        }
        print(f"after: {load()}")
        print(
            f"medians of {args.rounds} rounds, ms/step (busiest server's CPU/step): "
            + ", ".join(f"{n} {wall[n] * 1e3:.1f} ({cpu[n] * 1e3:.1f})" for n in rows)
        )
        print(
            f"data-parallel speed-up, 2 servers vs 1: wall {wall[one] / wall['2 servers']:.2f}x "
            f"(median of per-round ratios {paired['2 servers']:.2f}x; no snapshots "
            f"{wall[one] / wall['2 servers, no snapshots']:.2f}x, per round "
            f"{paired['2 servers, no snapshots']:.2f}x); work on the critical path (server "
            f"CPU) {cpu[one] / cpu['2 servers']:.2f}x (ideal 2.00x)"
        )
        small = fixed_costs(devices)
        print(
            "fixed cost per step (digits MLP, batch 32, ms): "
            + ", ".join(f"{n} {v * 1e3:.2f}" for n, v in small.items())
        )
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
