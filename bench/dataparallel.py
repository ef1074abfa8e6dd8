"""Data-parallel speed-up: one transformer training step on one server vs `br.DataParallel`
over two servers, each server pinned to a core of its own (`taskset`).

One run, the two variants interleaved round by round, medians over the rounds (this machine
is shared and noisy). Both train the same GPT (AdamW, captured with `br.compile`) on the same
whole batches; DataParallel gives each server half of every batch and all-reduces the
gradients between the servers (the ring over their QUIC links), so the speed-up is what two
servers buy after the all-reduce and the client's waits. Every engine runs one BLAS thread,
so a server is one core's worth of work. The loss is read every step (as a training loop
that logs it does; DataParallel also waits for the replicas before each step to keep its
snapshot, see the README).

Run: .venv/bin/python bench/dataparallel.py [--steps N] [--rounds R] [--batch B]
"""

from __future__ import annotations

import argparse
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


def pinned(core: int) -> tuple[str, ...]:
    """`taskset -c CORE` when there is a core to pin to, else nothing (said in the output)."""
    if shutil.which("taskset") is None or (os.cpu_count() or 1) <= core:
        return ()
    return ("taskset", "-c", str(core))


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


def time_one(dev: Any, batch: int, steps: int) -> list[float]:
    model, opt, batches = build(batch, steps + 2)
    model.to(dev)
    run = br.compile(lambda x, y: step(model, opt, x, y))
    for x, y in batches[:2]:  # the captures
        run(dev.tensor(x), dev.tensor(y)).item()
    times = []
    for x, y in batches[2:]:
        t = time.perf_counter()
        run(dev.tensor(x), dev.tensor(y)).item()
        times.append(time.perf_counter() - t)
    return times


def time_parallel(devices: list[Any], batch: int, steps: int, **opts: Any) -> list[float]:
    model, opt, batches = build(batch, steps + 2)
    dp = br.DataParallel(model, opt, devices=devices, **opts)
    run = dp.compile(step)
    for x, y in batches[:2]:
        run(x, y).item()
    times = []
    for x, y in batches[2:]:
        t = time.perf_counter()
        run(x, y).item()
        times.append(time.perf_counter() - t)
    dp.close()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3, help="timed steps per round and variant")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32, help="whole batch (each server: half)")
    args = ap.parse_args()
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
            f"{args.batch}; servers pinned: {[' '.join(p) or 'no (taskset missing)' for p in prefixes]}"
        )
        print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        rows: dict[str, list[float]] = {
            "1 server": [],
            "2 servers": [],
            "2 servers, no snapshots": [],
        }
        for r in range(args.rounds):
            times = {
                "1 server": time_one(devices[0], args.batch, args.steps),
                "2 servers": time_parallel(devices, args.batch, args.steps),
                "2 servers, no snapshots": time_parallel(
                    devices, args.batch, args.steps, snapshot_every=None
                ),
            }
            for name, t in times.items():
                rows[name].append(statistics.median(t))
            print(f"round {r + 1}: " + "   ".join(f"{n} {rows[n][-1] * 1e3:7.1f} ms" for n in rows))
        med = {n: statistics.median(v) for n, v in rows.items()}
        print(f"load average after: {os.getloadavg()[0]:.1f}")
        print(
            f"medians of {args.rounds} rounds (ms/step): "
            + ", ".join(f"{n} {v * 1e3:.1f}" for n, v in med.items())
        )
        print(
            f"data-parallel speed-up, 2 servers vs 1: {med['1 server'] / med['2 servers']:.2f}x "
            f"(without the per-step snapshot wait: "
            f"{med['1 server'] / med['2 servers, no snapshots']:.2f}x; ideal 2.00x)"
        )
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
