"""Learning-rate schedules: step -> multiplier of each group's base lr.

The optimizer feeds the product into the step's graph as a `dev.scalar` binding, so a
schedule changes numbers only; the step graph is registered once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

Schedule = Callable[[int], float]


@dataclass(frozen=True)
class WarmupCosine:
    """Linear warm-up from `1 / warmup_steps` to 1, then a cosine decay to `min_ratio` at
    `total_steps` (held there after). `total_steps=None` keeps 1 after warm-up."""

    warmup_steps: int = 0
    total_steps: int | None = None
    min_ratio: float = 0.0

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.total_steps is None:
            return 1.0
        span = max(self.total_steps - self.warmup_steps, 1)
        progress = min((step - self.warmup_steps) / span, 1.0)
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def linear_warmup(warmup_steps: int) -> Schedule:
    """A schedule rising linearly to 1 over ``warmup_steps``, then held at 1."""
    return WarmupCosine(warmup_steps=warmup_steps)


def cosine(total_steps: int, warmup_steps: int = 0, min_ratio: float = 0.0) -> Schedule:
    """Linear warm-up, then a cosine decay to ``min_ratio`` at ``total_steps`` (held after)."""
    return WarmupCosine(warmup_steps, total_steps, min_ratio)


def constant() -> Schedule:
    """A schedule that keeps every group's base learning rate."""
    return WarmupCosine()
