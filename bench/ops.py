"""Engine step against hand-written NumPy, and the cost of recording one op.

Prints, from one process run (ratios side by side, medians over repeats):
  - the digits-MLP training step (forward, cross-entropy, backward, AdamW) on Device.cpu()
    with its graph replayed, against the same step written by hand in NumPy;
  - the per-op recording cost (record only, no execution).
Usage: python bench/ops.py [--batch 64] [--hidden 128] [--repeats 7]
       BURN_REMOTE_POOL=1 python bench/ops.py   (every tensor in the adaptive pools)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import burn_remote as br
import numpy as np
from burn_remote import functional as F


def numpy_step_factory(params, batch, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, wd=1e-2):
    w1, b1_, w2, b2_ = [p.copy() for p in params]
    state = [[np.zeros_like(p), np.zeros_like(p)] for p in (w1, b1_, w2, b2_)]
    t = [0]

    def step(x, y):
        nonlocal w1, b1_, w2, b2_
        h_pre = x @ w1.T + b1_
        h = np.maximum(h_pre, 0)
        logits = h @ w2.T + b2_
        m = logits.max(axis=1, keepdims=True)
        e = np.exp(logits - m)
        s = e.sum(axis=1, keepdims=True)
        logp = logits - m - np.log(s)
        loss = -logp[np.arange(len(y)), y].mean()
        g = e / s
        g[np.arange(len(y)), y] -= 1
        g /= len(y)
        gw2 = g.T @ h
        gb2 = g.sum(axis=0)
        gh = g @ w2
        gh[h_pre <= 0] = 0
        gw1 = gh.T @ x
        gb1 = gh.sum(axis=0)
        t[0] += 1
        bc1, bc2 = 1 - b1 ** t[0], 1 - b2 ** t[0]
        new = []
        for p, gp, st in zip((w1, b1_, w2, b2_), (gw1, gb1, gw2, gb2), state):
            p = p * (1 - lr * wd)
            st[0] = b1 * st[0] + (1 - b1) * gp
            st[1] = b2 * st[1] + (1 - b2) * gp * gp
            p -= lr * (st[0] / bc1) / (np.sqrt(st[1] / bc2) + eps)
            new.append(p)
        w1, b1_, w2, b2_ = new
        return loss

    return step


def median_time(fn, n_iter, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n_iter):
            fn()
        times.append((time.perf_counter() - t0) / n_iter)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    x = rng.random((args.batch, 64), dtype=np.float32)
    y = rng.integers(0, 10, args.batch)
    pooled = os.environ.get("BURN_REMOTE_POOL", "") == "1"
    dev = br.Device.cpu()
    br.nn.seed(0)
    model = br.nn.Sequential(
        br.nn.Linear(64, args.hidden), br.nn.ReLU(), br.nn.Linear(args.hidden, 10)
    ).to(dev)
    opt = br.optim.AdamW(model.parameters(), lr=1e-3)
    xb, yb = dev.tensor(x), dev.tensor(y)

    def engine_step():
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad()
        dev.sync()
        return loss

    params = [p.numpy() for p in model.parameters()]
    np_step = numpy_step_factory(params, args.batch)

    def numpy_step():
        np_step(x, y)

    for _ in range(5):  # warm up: the first step registers the graph
        engine_step()
        numpy_step()

    # the replay alone: one step's cached plan run again on that step's inputs, no recording
    runtime = dev._rec.runtime
    seen = {}

    def spy(capture):
        seen["cap"], seen["inputs"] = capture, [runtime.store[i] for i in capture.input_ids]
        real_execute(capture)

    real_execute, runtime.execute = runtime.execute, spy
    engine_step()
    runtime.execute = real_execute
    cap, inputs = seen["cap"], seen["inputs"]
    plan = runtime.executor.plan(cap.digest)

    def replay():
        runtime.executor.run(plan, inputs, cap.values)

    t_engine, t_numpy, t_replays = [], [], []
    for _ in range(args.repeats):  # interleave so noise hits all three alike
        t_engine.append(median_time(engine_step, args.iters, 1))
        t_numpy.append(median_time(numpy_step, args.iters, 1))
        t_replays.append(median_time(replay, args.iters, 1))
    te, tn = statistics.median(t_engine), statistics.median(t_numpy)
    t_replay = statistics.median(t_replays)

    # recording cost: record a chain of ops without executing it
    a = dev.tensor(rng.random((4, 4), dtype=np.float32))
    n_ops = 2000

    def record_chain():
        t = a
        for _ in range(n_ops // 2):
            t = (t * a).relu()
        dev._rec.pending.clear()  # discard: this measures recording alone

    t_rec = median_time(record_chain, 1, args.repeats) / n_ops
    stats = dev.stats()
    print(
        f"digits MLP step (batch {args.batch}, 64-{args.hidden}-10, AdamW, pools {'on' if pooled else 'off'})"
    )
    print(f"  hand-written NumPy            : {tn * 1e6:8.1f} us/step")
    print(
        f"  engine, cached plan replayed  : {t_replay * 1e6:8.1f} us/step  ratio {t_replay / tn:5.2f}x (target <= 1.3x)"
    )
    print(f"  engine, record + replay       : {te * 1e6:8.1f} us/step  ratio {te / tn:5.2f}x")
    print(f"  graphs registered {stats['graphs_registered']}, replays {stats['replays']}")
    print(f"recording cost           : {t_rec * 1e6:8.2f} us/op  (target <= 30 us/op)")


if __name__ == "__main__":
    main()
