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
        """The lr of each param group for epoch ``last_epoch`` (one float per group, in the
        optimizer's order); each scheduler defines its formula here."""
        raise NotImplementedError

    def step(self) -> None:
        """Advance one epoch and write each group's new lr into the optimizer: call it once per epoch,
        after `optimizer.step()`, as in torch. Takes effect at the optimizer's next step, with no new
        graph (the lr is a binding)."""
        self.last_epoch += 1
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr

    def get_last_lr(self) -> list[float]:
        """The lr each param group holds now (what the optimizer's next step uses)."""
        return [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        """``base_lrs`` and ``last_epoch``: what a checkpoint needs to resume the schedule where it
        stopped (the optimizer's own state is saved separately)."""
        return {"base_lrs": list(self.base_lrs), "last_epoch": self.last_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back a `state_dict`: the schedule resumes at its epoch. The groups' current lrs are
        not touched until the next `step`."""
        self.base_lrs, self.last_epoch = list(state["base_lrs"]), int(state["last_epoch"])


class StepLR(LRScheduler):
    """lr = base_lr * gamma ** (epoch // step_size)."""

    def __init__(self, optimizer: Any, step_size: int, gamma: float = 0.1) -> None:
        super().__init__(optimizer)
        self.step_size, self.gamma = step_size, gamma

    def get_lr(self) -> list[float]:
        """base_lr * gamma ** (last_epoch // step_size) for each group."""
        return [lr * self.gamma ** (self.last_epoch // self.step_size) for lr in self.base_lrs]


class ExponentialLR(LRScheduler):
    """lr = base_lr * gamma ** epoch: decays by ``gamma`` at every `step()`."""

    def __init__(self, optimizer: Any, gamma: float) -> None:
        super().__init__(optimizer)
        self.gamma = gamma

    def get_lr(self) -> list[float]:
        """base_lr * gamma ** last_epoch for each group."""
        return [lr * self.gamma**self.last_epoch for lr in self.base_lrs]


__all__ = ["ExponentialLR", "LRScheduler", "StepLR"]
