"""Peak memory of real training steps: the floor, the static baseline, the adaptive pools.

Runs a CNN step (two 3x3 conv layers on 28x28 inputs, batch 64) and a transformer step
(4 layers, d_model 256, sequence 128, batch 8) through the engine on the CPU device, records
every allocation and free the engine makes (uploads, graph intermediates, outputs, drops),
and replays that one trace into two static pools that never release (the page layout Burn
used before adaptive pools, CubeCL's SubSlices, sized for this device's memory as it sized
them; and our own tighter fixed classes) and into the adaptive pools with arena planning.
Prints, per model: peak live bytes (the floor), peak reserved for each policy, their ratios,
and the engine's own measured stats.

    .venv/bin/python bench/memory.py [--steps N] [--device-memory GIB]
"""

from __future__ import annotations

import argparse
import math
import os

import numpy as np
from burn_remote import Device, nn, optim
from burn_remote import functional as F
from burn_remote._device import LocalRuntime
from burn_remote.engine.memory import Event, fmt_bytes, replay, subslice_classes

SEED = 0
CNN_BATCH = 64
TF_LAYERS, TF_D, TF_HEADS, TF_FF, TF_SEQ, TF_BATCH, TF_VOCAB = 4, 256, 4, 1024, 128, 8, 1000


class ConvNet(nn.Module):
    """conv(1->32) relu pool, conv(32->64) relu pool, linear(3136->128) relu, linear(128->10)."""

    def __init__(self, dev: Device) -> None:
        rng = np.random.default_rng(SEED)
        self.c1 = dev.tensor(rng.normal(0, 0.3, (32, 1, 3, 3)), requires_grad=True)
        self.b1 = dev.tensor(np.zeros(32), requires_grad=True)
        self.c2 = dev.tensor(rng.normal(0, 0.06, (64, 32, 3, 3)), requires_grad=True)
        self.b2 = dev.tensor(np.zeros(64), requires_grad=True)
        self.fc1 = nn.Linear(64 * 7 * 7, 128, device=dev)
        self.fc2 = nn.Linear(128, 10, device=dev)

    def forward(self, x):
        x = F.max_pool2d(F.relu(F.conv2d(x, self.c1, self.b1, padding=1)), 2)
        x = F.max_pool2d(F.relu(F.conv2d(x, self.c2, self.b2, padding=1)), 2)
        return self.fc2(F.relu(self.fc1(x.reshape(x.shape[0], -1))))


class Block(nn.Module):
    """Pre-norm transformer block: multi-head self-attention and a GELU MLP."""

    def __init__(self, dev: Device) -> None:
        self.qkv = nn.Linear(TF_D, 3 * TF_D, device=dev)
        self.proj = nn.Linear(TF_D, TF_D, device=dev)
        self.ff1 = nn.Linear(TF_D, TF_FF, device=dev)
        self.ff2 = nn.Linear(TF_FF, TF_D, device=dev)
        self.g1 = dev.tensor(np.ones(TF_D), requires_grad=True)
        self.g2 = dev.tensor(np.ones(TF_D), requires_grad=True)

    def forward(self, x):
        b, t, d = x.shape
        dh = d // TF_HEADS
        h = self.qkv(F.layer_norm(x, self.g1))
        q, k, v = (
            h[:, :, i * d : (i + 1) * d].reshape(b, t, TF_HEADS, dh).permute(0, 2, 1, 3)
            for i in range(3)
        )
        att = F.softmax((q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(dh)), axis=-1)
        y = (att @ v).permute(0, 2, 1, 3).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.ff2(F.gelu(self.ff1(F.layer_norm(x, self.g2))))


class Transformer(nn.Module):
    def __init__(self, dev: Device) -> None:
        rng = np.random.default_rng(SEED)
        self.emb = dev.tensor(rng.normal(0, 0.02, (TF_VOCAB, TF_D)), requires_grad=True)
        self.blocks = nn.ModuleList([Block(dev) for _ in range(TF_LAYERS)])
        self.head = nn.Linear(TF_D, TF_VOCAB, device=dev)

    def forward(self, ids):
        x = F.embedding(ids, self.emb)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def trace_training(name: str, steps: int) -> tuple[list[Event], list[int], object]:
    """Train `steps` steps on the CPU device, recording the engine's allocation trace; returns
    the trace, the trace positions where each step ended, and the device's measured stats."""
    runtime = LocalRuntime("cpu", pooled=True)  # the pooled engine runtime
    dev = Device("cpu", runtime)
    runtime.memory.memory.reset_peaks()
    trace = runtime.memory.start_trace()
    rng = np.random.default_rng(SEED)
    if name == "cnn":
        model = ConvNet(dev)
        batch = lambda: (rng.normal(size=(CNN_BATCH, 1, 28, 28)), rng.integers(0, 10, CNN_BATCH))  # noqa: E731
        reshape_logits = lambda y: y  # noqa: E731
    else:
        model = Transformer(dev)
        batch = lambda: (  # noqa: E731
            rng.integers(0, TF_VOCAB, (TF_BATCH, TF_SEQ)),
            rng.integers(0, TF_VOCAB, (TF_BATCH * TF_SEQ,)),
        )
        reshape_logits = lambda y: y.reshape(TF_BATCH * TF_SEQ, TF_VOCAB)  # noqa: E731
    opt = optim.Adam(model.parameters(), lr=1e-3)
    ends = []
    for _ in range(steps):
        x, y = batch()
        loss = F.cross_entropy(reshape_logits(model(dev.tensor(x))), dev.tensor(y))
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss.item()
        ends.append(len(trace))
    stats = dev.memory_stats()
    del model, opt, loss
    dev.sync()
    runtime.memory.trace = None
    return list(trace), ends, stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="training steps (>= 3)")
    parser.add_argument(
        "--device-memory",
        type=float,
        default=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30,
        help="GiB of device memory the SubSlices layout is sized for (default: this host's RAM, "
        "the CPU device's memory)",
    )
    args = parser.parse_args()
    steps = max(3, args.steps)
    subslices = subslice_classes(int(args.device_memory * 2**30))
    print(
        f"SubSlices layout for {args.device_memory:.1f} GiB: "
        + ", ".join(f"{fmt_bytes(a)} slices on {fmt_bytes(b)} pages" for a, b in subslices[:-1])
        + f", then {fmt_bytes(subslices[-1][1])} pages"
    )
    for name, title in (("cnn", "CNN, 28x28, batch 64"), ("tf", "transformer, 4x256, seq 128")):
        trace, ends, measured = trace_training(name, steps)
        # Steps 1 and 2 register their graphs (optimizer state appears in step 1): setup.
        setup = trace[: ends[1]]
        loop = [trace[a:b] for a, b in zip(ends[1:], ends[2:])]
        old = replay(loop, "static", setup, movable=False, static_classes=subslices)
        static = replay(loop, "static", setup, movable=False)
        adaptive = replay(loop, "adaptive", setup, movable=False)
        floor = static.peak_live
        print(f"== {title}: {steps} steps, {sum(1 for _ in trace)} trace events")
        print(f"  peak live (floor)            {fmt_bytes(floor):>10}")
        for label, base in (
            ("static, SubSlices layout ", old),
            ("static, tight classes    ", static),
        ):
            print(f"  {label}  {fmt_bytes(base.peak_reserved):>10}  {base.ratio:.3f}x live")
        print(
            f"  adaptive + arena, peak res.  {fmt_bytes(adaptive.peak_reserved):>10}"
            f"  {adaptive.ratio:.3f}x live, "
            f"{100 * (1 - adaptive.peak_reserved / old.peak_reserved):.1f}% below the SubSlices "
            f"static pool, {100 * (1 - adaptive.peak_reserved / static.peak_reserved):.1f}% "
            "below the tight one"
        )
        print(
            f"  steady-state page reservations per step: static "
            f"{static.steady_page_allocs / len(loop):.1f}, adaptive "
            f"{adaptive.steady_page_allocs / len(loop):.1f}; arena {fmt_bytes(adaptive.arena_bytes)}"
            f" (lower bound {fmt_bytes(adaptive.arena_lower_bound)})"
        )
        print("  engine's own stats (adaptive pools, dry run included):")
        print("    " + str(measured).replace("\n", "\n    "))


if __name__ == "__main__":
    main()
