"""SGD, Adam and AdamW over the fused update ops of protocol/ops_optim.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._ops import call
from .._tensor import Tensor
from ._groups import ParamGroup
from ._optimizer import Group, Optimizer
from ._schedule import Schedule


class SGD(Optimizer):
    """SGD with momentum (PyTorch's form: buf = m buf + (1 - dampening) g), Nesterov
    (step = g + m buf) and L2 weight decay (g += wd p)."""

    def __init__(
        self,
        params: Any,
        lr: float = 1e-2,
        momentum: float = 0.0,
        dampening: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
        groups: Sequence[ParamGroup] = (),
        schedule: Schedule | None = None,
    ) -> None:
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: Nesterov needs momentum > 0 and no dampening")
        super().__init__(
            params,
            groups,
            schedule,
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            nesterov=nesterov,
            weight_decay=weight_decay,
        )

    def _update(self, p: Tensor, g: Tensor, group: Group) -> None:
        s = group.settings
        (buf,) = self._state(p, "momentum")
        new_p, new_buf = call(
            "sgd_update",
            p,
            g,
            buf,
            self._lr(group, p),
            momentum=s["momentum"],
            dampening=s["dampening"],
            nesterov=s["nesterov"],
            weight_decay=s["weight_decay"],
        )
        p._assign(new_p)
        buf._assign(new_buf)


class Adam(Optimizer):
    """Adam; `weight_decay` is L2 added to the gradient (AdamW decouples it)."""

    decoupled = False

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        groups: Sequence[ParamGroup] = (),
        schedule: Schedule | None = None,
    ) -> None:
        super().__init__(
            params, groups, schedule, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay
        )

    def _update(self, p: Tensor, g: Tensor, group: Group) -> None:
        s = group.settings
        b1, b2 = s["betas"]
        m, v = self._state(p, "m", "v")
        new_p, new_m, new_v = call(
            "adam_update",
            p,
            g,
            m,
            v,
            self._lr(group, p),
            self._binding(group, p, "bc1", lambda: 1 - b1 ** (self.steps + 1)),
            self._binding(group, p, "bc2", lambda: 1 - b2 ** (self.steps + 1)),
            beta1=b1,
            beta2=b2,
            eps=s["eps"],
            weight_decay=s["weight_decay"],
            decoupled=self.decoupled,
        )
        p._assign(new_p)
        m._assign(new_m)
        v._assign(new_v)


class AdamW(Adam):
    """Adam with decoupled weight decay: p *= 1 - lr wd before the Adam step."""

    decoupled = True

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        groups: Sequence[ParamGroup] = (),
        schedule: Schedule | None = None,
    ) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, groups, schedule)


class Adadelta(Optimizer):
    """torch's Adadelta: v = rho v + (1 - rho) g^2; d = sqrt(u + eps) / sqrt(v + eps) g;
    u = rho u + (1 - rho) d^2; p -= lr d (L2 `weight_decay` added to g first). Written with
    tensor ops under no_grad (there is no fused op for it)."""

    def __init__(
        self,
        params: Any,
        lr: float = 1.0,
        rho: float = 0.9,
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        groups: Sequence[ParamGroup] = (),
        schedule: Schedule | None = None,
    ) -> None:
        super().__init__(
            params, groups, schedule, lr=lr, rho=rho, eps=eps, weight_decay=weight_decay
        )

    def _update(self, p: Tensor, g: Tensor, group: Group) -> None:
        s = group.settings
        rho, eps = s["rho"], s["eps"]
        v, u = self._state(p, "square_avg", "acc_delta")
        if s["weight_decay"]:
            g = g + p * s["weight_decay"]
        new_v = v * rho + g * g * (1 - rho)
        delta = (u + eps).sqrt() / (new_v + eps).sqrt() * g
        new_u = u * rho + delta * delta * (1 - rho)
        rate = self._lr(group, p).cast(p.dtype)
        p._assign(p - delta * rate)
        v._assign(new_v)
        u._assign(new_u)
