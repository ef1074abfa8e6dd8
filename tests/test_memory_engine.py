"""The pools under the real engine: same numbers as without them, stats on the device,
and the quota error reaching the user with the device still usable."""

import numpy as np
import pytest
from burn_remote import functional as F
from burn_remote import nn, optim
from burn_remote._device import Device, LocalRuntime
from burn_remote.engine.memory import MemoryQuotaExceeded


def train(dev, steps=3):
    nn.seed(0)
    model = nn.Sequential(nn.Linear(32, 64, device=dev), nn.ReLU(), nn.Linear(64, 10, device=dev))
    opt = optim.Adam(model.parameters(), lr=1e-2)
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(steps):
        x, y = rng.normal(size=(16, 32)), rng.integers(0, 10, 16)
        loss = F.cross_entropy(model(dev.tensor(x)), dev.tensor(y))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def fresh(limit=None, pooled=True):
    return Device("cpu", LocalRuntime("cpu", memory_limit=limit, pooled=pooled))


def test_pooled_engine_matches_plain_arrays():
    pooled, plain = fresh(pooled=True), fresh(pooled=False)
    assert train(pooled, 4) == train(plain, 4)
    keep = plain.tensor(np.ones(1000, np.float32))
    unpooled = plain.memory_stats()  # without pools the live tensor bytes are still counted
    assert unpooled.in_use == keep.size * 4 and unpooled.peak_in_use > unpooled.in_use
    stats = pooled.memory_stats()
    assert stats.peak_in_use > 0 and stats.reserved >= stats.in_use
    assert any(p.name.startswith("arena:") for p in stats.pools)
    assert "memory on cpu" in str(stats)


def test_quota_error_is_clear_and_device_stays_usable():
    dev = fresh(limit=1 << 20)
    small = dev.tensor(np.ones(1000, dtype=np.float32))
    with pytest.raises(MemoryQuotaExceeded, match="memory limit exceeded on cpu"):
        dev.tensor(np.ones(1 << 19, dtype=np.float32))  # 2 MiB
    assert float((small * 2).sum().item()) == 2000.0


def test_donated_inputs_free_their_memory_inside_the_graph():
    """An input nobody holds any more (an optimizer's old weights) gives its bytes to the
    step's results: the peak is one buffer, not two."""
    n = 1 << 18  # 1 MiB of float32

    def peak(donate: bool) -> int:
        dev = fresh(pooled=True)
        x = dev.tensor(np.ones(n, np.float32))
        y = x * 2.0
        keep = x if not donate else None
        del x
        dev.sync()
        assert y.numpy()[0] == 2.0 and (keep is None) == donate
        return dev.memory_stats().peak_in_use

    donated, kept = peak(True), peak(False)
    assert kept >= 2 * n * 4
    assert donated < 1.5 * n * 4
