"""Flood: a benign peer's captured-MLP step, unloaded and beside a flooding peer, side by side
on one loopback server (issue 35's fair share).

The flooding peer sends, round after round, 20 matmuls of 1024 x 1024 (one flush each, all
queued at once) and reads a 64 MiB tensor. ``--flood graph`` sends the 20 as one graph
instead (a chain in one flush: one message of ~0.5 s of engine work), which only the engine's
checkpoints between plan steps can interrupt. The benign peer (its own key) steps a captured
digits-sized MLP (64 -> 128 -> 10, batch 64, data on the device) and reads each loss, so a
step is one round trip. Each repeat times STEPS benign steps unloaded, then STEPS with the
flood running; the figures are medians over the repeats of each phase's median and p99, and
their ratio (the issue's target: median <= 2x, p99 <= 3x).

The flooding peer runs in a process of its own, as another user's program would (``--in
thread`` puts it in the benign client's process instead, where its client-side work, a 64
MiB read's packets above all, also takes the benign client's interpreter lock).

Run: .venv/bin/python bench/flood.py [--repeats 3] [--steps 100] [--slots N]
[--flood both|matmuls|reads|graph] [--in process|thread]
(``--slots`` sets BURN_REMOTE_ENGINE_SLOTS for the server: engine turns at once; by default
one on the CPU engine, server/_fair.CPU_SLOTS.)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import burn_remote as br
import numpy as np
from burn_remote import RemoteDevice, nn, optim
from burn_remote import functional as F
from burn_remote.server._fair import CPU_SLOTS, SLOTS_ENV
from burn_remote.server.testing import start_server

FLOOD_MATMULS = 20
READ_BYTES = 64 * 2**20
BATCH = 64


def benign_stepper(dev: RemoteDevice):  # type: ignore[no-untyped-def]
    """A captured MLP step (data resident on the device) returning its loss tensor."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1024, 64)).astype(np.float32)
    y = rng.integers(0, 10, 1024)
    nn.seed(0)
    net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(dev)
    opt = optim.AdamW(net.parameters(), lr=1e-3)
    xs, ys, rows = dev.tensor(x), dev.tensor(y), dev.tensor(np.arange(BATCH))

    @br.compile(device=dev)
    def step(start):  # type: ignore[no-untyped-def]
        idx = rows + start
        loss = F.cross_entropy(net(xs[idx]), ys[idx])
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    k = [0]

    def one() -> float:
        k[0] += 1
        return step(dev.tensor(np.int64((k[0] * BATCH) % (1024 - BATCH)))).item()

    return one


def timed(one, steps: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(median, p99) of ``steps`` benign steps, in ms."""
    lat = []
    for _ in range(steps):
        t0 = time.perf_counter()
        one()
        lat.append((time.perf_counter() - t0) * 1000)
    lat.sort()
    return statistics.median(lat), lat[min(len(lat) - 1, int(0.99 * len(lat)))]


def flood(dev: RemoteDevice, stop: threading.Event, rounds: list[int], kind: str) -> None:
    rng = np.random.default_rng(1)
    a = dev.tensor(rng.standard_normal((1024, 1024)).astype(np.float32))
    b = dev.tensor(rng.standard_normal((1024, 1024)).astype(np.float32))
    big = dev.tensor(np.ones(READ_BYTES // 4, np.float32))
    dev.sync()
    while not stop.is_set():
        if kind == "graph":
            c = a
            for _ in range(FLOOD_MATMULS):
                c = (c @ b) * (1 / 32)  # scaled: the chain stays finite
            c.numpy()
        elif kind != "reads":
            outs = []
            for _ in range(FLOOD_MATMULS):
                outs.append(a @ b)
                dev.flush()
            outs[-1].numpy()
        if kind in ("both", "reads"):
            big.numpy()
        rounds[0] += 1


def flood_peer(target: str, key: str, kind: str) -> None:
    """The flooding peer as a process of its own (``--in process``): floods until its stdin
    closes, then prints the rounds it ran."""
    dev = RemoteDevice(target, key=Path(key))
    stop, rounds = threading.Event(), [0]
    thread = threading.Thread(target=flood, args=(dev, stop, rounds, kind), daemon=True)
    thread.start()
    print("flooding", flush=True)
    sys.stdin.read()
    stop.set()
    thread.join(300)
    dev.close()
    print(rounds[0], flush=True)


class Flooder:
    """The flooding peer, started beside the benign one: a thread of this process or a
    process of its own."""

    def __init__(self, target: str, key: Path, kind: str, where: str) -> None:
        self.rounds = 0
        if where == "thread":
            self.dev = RemoteDevice(target, key=key)
            self.stop, self.count = threading.Event(), [0]
            self.thread = threading.Thread(
                target=flood, args=(self.dev, self.stop, self.count, kind), daemon=True
            )
            self.thread.start()
            self.proc = None
        else:
            cmd = [sys.executable, __file__, "--flood-peer", target, str(key), kind]
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            assert self.proc.stdout is not None and self.proc.stdout.readline() == "flooding\n"

    def close(self) -> None:
        if self.proc is None:
            self.stop.set()
            self.thread.join(300)
            self.dev.close()
            self.rounds = self.count[0]
            return
        out, _ = self.proc.communicate("", timeout=300)
        self.rounds = int(out.split()[-1])


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--flood-peer":
        flood_peer(*sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--slots", type=int, default=None, help="BURN_REMOTE_ENGINE_SLOTS")
    ap.add_argument(
        "--flood",
        choices=("both", "matmuls", "reads", "graph"),
        default="both",
        help="what the flooding peer sends (the issue's flood: both)",
    )
    ap.add_argument(
        "--in",
        dest="where",
        choices=("process", "thread"),
        default="process",
        help="where the flooding peer runs (default: a process of its own)",
    )
    args = ap.parse_args()
    if args.slots is not None:
        os.environ[SLOTS_ENV] = str(args.slots)
    home = tempfile.mkdtemp(prefix="burn-remote-flood-")
    os.chmod(home, 0o700)
    os.environ["BURN_REMOTE_HOME"] = home
    server = start_server(str(Path(home) / "server"))
    target = f"{server.peer_id}@{server.address}"
    try:
        benign = RemoteDevice(target, key=Path(home) / "benign.key")
        one = benign_stepper(benign)
        for _ in range(20):  # warm: compiled, captured, timed
            one()
        quiet, loud, rounds = [], [], [0]
        for _ in range(args.repeats):
            quiet.append(timed(one, args.steps))
            flooder = Flooder(target, Path(home) / "flood.key", args.flood, args.where)
            time.sleep(1.0)  # the flood's tensors are up and its first round queued
            loud.append(timed(one, args.steps))
            flooder.close()
            rounds[0] += flooder.rounds
        benign.close()
    finally:
        server.stop()
    slots = os.environ.get(SLOTS_ENV, f"default ({CPU_SLOTS})")
    print(f"benign captured-MLP step, {args.steps} steps x {args.repeats} repeats, "
          f"engine slots {slots}, flood {args.flood} (in a {args.where}), "
          f"flood rounds run {rounds[0]}")  # fmt: skip
    med = [statistics.median(r[0] for r in rows) for rows in (quiet, loud)]
    p99 = [statistics.median(r[1] for r in rows) for rows in (quiet, loud)]
    print(f"{'':>8} {'unloaded':>10} {'flooded':>10} {'ratio':>7}")
    print(f"{'median':>8} {med[0]:>8.2f}ms {med[1]:>8.2f}ms {med[1] / med[0]:>6.2f}x")
    print(f"{'p99':>8} {p99[0]:>8.2f}ms {p99[1]:>8.2f}ms {p99[1] / p99[0]:>6.2f}x")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
