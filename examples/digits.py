"""The digits MLP: scikit-learn's bundled 8x8 digits, a 64-128-10 MLP, AdamW.

Shared by the demo, the tests and the benchmarks so they all train the same thing.
"""

from __future__ import annotations

from collections.abc import Iterator

import burn_remote as br
import numpy as np
from burn_remote import functional as F


def load(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Shuffled 80/20 split of the 1797 digits, pixels scaled to [0, 1]."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = (x[order] / 16.0).astype(np.float32), y[order].astype(np.int64)
    cut = int(0.8 * len(x))
    return x[:cut], y[:cut], x[cut:], y[cut:]


def model(device: br.Device, hidden: int = 128, seed: int = 0) -> br.nn.Module:
    br.nn.seed(seed)
    return br.nn.Sequential(br.nn.Linear(64, hidden), br.nn.ReLU(), br.nn.Linear(hidden, 10)).to(
        device
    )


def batches(
    x: np.ndarray, y: np.ndarray, size: int, seed: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Full batches only, so every step has the same shapes and replays one graph."""
    order = np.random.default_rng(seed).permutation(len(x))
    for i in range(0, len(x) - size + 1, size):
        idx = order[i : i + size]
        yield x[idx], y[idx]


def train(
    device: br.Device,
    epochs: int = 12,
    batch: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
    progress: bool = False,
) -> tuple[br.nn.Module, list[float], float]:
    """Train and return (model, per-epoch last loss, test accuracy). The step is compiled
    (`br.compile`): `train.last_step` keeps it, for its capture statistics."""
    xtr, ytr, xte, yte = load(seed)
    net = model(device, seed=seed)
    opt = br.optim.AdamW(net.parameters(), lr=lr)
    steps = epochs * (len(xtr) // batch)

    @br.compile  # recorded on the first calls, then replayed: no per-step op recording
    def train_step(xb: br.Tensor, yb: br.Tensor) -> br.Tensor:
        loss = F.cross_entropy(net(xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=steps, desc=f"digits MLP on {device.spec}", unit="step")
    losses = []
    for epoch in range(epochs):
        loss = None
        for xb, yb in batches(xtr, ytr, batch, seed + epoch):
            loss = train_step(device.tensor(xb), device.tensor(yb))  # one small message
            if bar is not None:
                bar.update(1)
        value = loss.item()  # the only wait of the epoch
        losses.append(value)
        if bar is not None:
            bar.set_postfix(loss=f"{value:.4f}")
    if bar is not None:
        bar.close()
    train.last_step = train_step
    return net, losses, accuracy(net, device, xte, yte)


def accuracy(net: br.nn.Module, device: br.Device, x: np.ndarray, y: np.ndarray) -> float:
    with br.no_grad():
        pred = net(device.tensor(x)).argmax(axis=-1).numpy()
    return float((pred == y).mean())
