"""A first script against a real server (bench/first_contact.py times it): the digits MLP's
first loss through a loopback RemoteDevice equals the one on Device.cpu(), and what the
script never needs stays unloaded: trio (the client's connection runs on threads), the
language-model half of `nn`, and the engine's pools and traces."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
import numpy as np
import burn_remote as br
from burn_remote import functional as F

def first_loss(dev):
    rng = np.random.default_rng(0)
    x, y = rng.random((64, 64), dtype=np.float32), np.arange(64) % 10
    br.nn.seed(0)
    net = br.nn.Sequential(br.nn.Linear(64, 128), br.nn.ReLU(), br.nn.Linear(128, 10)).to(dev)
    opt = br.optim.AdamW(net.parameters(), lr=1e-3)
    loss = F.cross_entropy(net(dev.tensor(x)), dev.tensor(y))
    loss.backward()
    opt.step()
    return loss.item()

print(first_loss(br.RemoteDevice(sys.argv[1])), first_loss(br.Device.cpu()))
unused = ("trio", "burn_remote.nn._gpt", "burn_remote.nn._generate", "safetensors",
          "burn_remote.engine.memory._trace", "burn_remote.engine.memory._graph")
print(",".join(m for m in unused if m in sys.modules))
"""


def test_first_remote_step_matches_the_cpu_and_loads_no_more_than_it_needs(server, client_home):
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, server.target], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    losses, loaded = out.stdout.splitlines()
    remote, cpu = (float(v) for v in losses.split())
    assert abs(remote - cpu) <= 1e-5 * abs(cpu), (remote, cpu)
    assert loaded == "", f"loaded without need: {loaded}"
