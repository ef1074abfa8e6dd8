"""The small next-token task the LoRA tests train on, shared by the CPU and remote suites."""

from __future__ import annotations

import numpy as np
from burn_remote import optim


def cycle_steps(model, dev, steps: int, stride: int, lr: float = 1e-2) -> list[float]:
    """Train on the cycle 0 -> stride -> 2 stride ... (mod 8); the loss of each step."""
    context = model.config.context
    pattern = np.tile((np.arange(8) * stride) % 8, 4)
    opt = optim.AdamW(model, lr=lr, weight_decay=0.0)
    losses = []
    for step in range(steps):
        seq = pattern[step % 8 : step % 8 + context + 1][None].repeat(4, 0)
        loss = model.loss(dev.tensor(seq[:, :-1]), dev.tensor(seq[:, 1:]))
        loss.backward()
        optim.clip_grad_norm(model, 1.0)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses
