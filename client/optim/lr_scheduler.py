"""torch.optim.lr_scheduler's epoch-stepped schedulers, over an optimizer's `param_groups`.

`scheduler.step()` sets each group's lr; the optimizer feeds it to the step graph as a
binding, so a schedule never re-registers the graph. (Per-step schedules that the optimizer
evaluates itself are `optim.cosine` and friends.)
"""

from __future__ import annotations

from typing import Any


class LRScheduler:
    """Base: `get_lr()` from `base_lrs` and `last_epoch`; `step()` advances one epoch."""

    def __init__(self, optimizer: Any) -> None:
        self.optimizer = optimizer
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self.last_epoch = 0

    def get_lr(self) -> list[float]:
        raise NotImplementedError

    def step(self) -> None:
        self.last_epoch += 1
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr

    def get_last_lr(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return {"base_lrs": list(self.base_lrs), "last_epoch": self.last_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.base_lrs, self.last_epoch = list(state["base_lrs"]), int(state["last_epoch"])


class StepLR(LRScheduler):
    """lr = base_lr * gamma ** (epoch // step_size)."""

    def __init__(self, optimizer: Any, step_size: int, gamma: float = 0.1) -> None:
        super().__init__(optimizer)
        self.step_size, self.gamma = step_size, gamma

    def get_lr(self) -> list[float]:
        return [lr * self.gamma ** (self.last_epoch // self.step_size) for lr in self.base_lrs]


class ExponentialLR(LRScheduler):
    def __init__(self, optimizer: Any, gamma: float) -> None:
        super().__init__(optimizer)
        self.gamma = gamma

    def get_lr(self) -> list[float]:
        return [lr * self.gamma**self.last_epoch for lr in self.base_lrs]


__all__ = ["ExponentialLR", "LRScheduler", "StepLR"]
