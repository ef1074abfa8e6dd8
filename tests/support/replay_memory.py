"""Client memory over 10,000 replays of a captured step, measured in a process of its own
(tracemalloc counts every thread of a process: in the pytest process another test's leftover
thread would read as the step's). Run by tests/test_compile.py and
tests/remote/test_compile_remote.py: `python replay_memory.py cpu|<remote target>`; prints one
JSON line."""

from __future__ import annotations

import gc
import json
import sys
import tracemalloc

import burn_remote as br
import numpy as np
from burn_remote import functional as F
from burn_remote import nn, optim


def main(where: str) -> dict:
    dev = br.Device.cpu() if where == "cpu" else br.RemoteDevice(where)
    nn.seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).to(dev)
    opt = optim.AdamW(net.parameters(), lr=1e-3)
    rng = np.random.default_rng(0)
    x = dev.tensor(rng.standard_normal((8, 8)).astype(np.float32))
    y = dev.tensor(rng.integers(0, 3, 8))

    @br.compile
    def step(x, y):
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    def run(n: int) -> None:
        for i in range(n):
            loss = step(x, y)
            if i % 100 == 99:  # a read now and then, as a training loop does
                assert np.isfinite(loss.item())

    run(500)
    gc.collect()
    tensors = len(dev._rec.refs)
    tracemalloc.start()
    run(500)
    gc.collect()
    base, _ = tracemalloc.get_traced_memory()
    run(10_000)
    gc.collect()
    now, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    seen = {
        "grew": now - base,
        "tensors": tensors,
        "refs": len(dev._rec.refs),
        "specs": len(dev._rec.specs),
        "replays": step.stats()["replays"],
    }
    proto = getattr(getattr(dev, "_rt", None), "proto", None)
    if proto is not None:
        seen.update(
            journal=len(proto.journal), in_flight=len(proto.in_flight), results=len(proto.results)
        )
        dev.close()
    return seen


def measure(where: str) -> dict:
    """Run this script in a fresh interpreter; what it saw."""
    import subprocess

    out = subprocess.run(
        [sys.executable, __file__, where], capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
