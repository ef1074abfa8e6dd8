"""The digits MLP loop the remote tests, the demo and the bench share in spirit."""

from __future__ import annotations

from typing import Any

import numpy as np
from burn_remote import functional as F
from burn_remote import nn, optim


def digits(n: int = 512) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.data[:n] / 16.0).astype(np.float32)
    return x, d.target[:n].astype(np.int64)


def train(dev: Any, steps: int, batch: int = 64, on_step: Any = None) -> dict[str, Any]:
    """Train from a fixed seed; returns losses, final weights and accuracy."""
    x, y = digits()
    nn.seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)).to(dev)
    opt = optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for step in range(steps):
        i = (step * batch) % len(x)
        xb, yb = dev.tensor(x[i : i + batch]), dev.tensor(y[i : i + batch])
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        if on_step is not None:
            on_step(step, xb.size * 4 + yb.size * 8)
    pred = model(dev.tensor(x)).numpy().argmax(-1)
    return {
        "losses": losses,
        "weights": [p.numpy() for p in model.parameters()],
        "accuracy": float((pred == y).mean()),
    }
