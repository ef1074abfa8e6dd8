"""SGD, Adam and AdamW over fused update ops (protocol/ops_optim.py).

Per-step numbers (learning rate, bias corrections) enter each step's graph as `dev.scalar`
bindings, so step 1000 replays the graph that step 2 registered.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._autograd import no_grad
from .._ops import call
from .._tensor import Tensor


class Optimizer:
    def __init__(self, params: Iterable[Tensor], **defaults: Any) -> None:
        self.params = [p for p in params]
        if not self.params:
            raise ValueError(f"{type(self).__name__}: got no parameters to optimise")
        for p in self.params:
            if not p.requires_grad:
                raise ValueError(
                    f"{type(self).__name__}: a parameter of shape {p.shape} does not require gradients"
                )
        self.defaults = defaults
        self.lr = defaults["lr"]
        self.state: dict[int, dict[str, Tensor]] = {}
        self.steps = 0

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def _state(self, p: Tensor, *names: str) -> list[Tensor]:
        st = self.state.get(id(p))
        if st is None:
            st = self.state[id(p)] = {n: p.device.zeros(p.shape, p.dtype) for n in names}
        return [st[n] for n in names]

    def step(self) -> None:
        self.steps += 1
        with no_grad():
            for p in self.params:
                if p.grad is not None:
                    self._update(p, p.grad)

    def _update(self, p: Tensor, g: Tensor) -> None:
        raise NotImplementedError


class SGD(Optimizer):
    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 1e-2,
        momentum: float = 0.0,
        dampening: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(
            params,
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            nesterov=nesterov,
            weight_decay=weight_decay,
        )

    def _update(self, p: Tensor, g: Tensor) -> None:
        d = self.defaults
        (buf,) = self._state(p, "momentum")
        lr = p.device.scalar(self.lr, p.dtype)
        new_p, new_buf = call(
            "sgd_update",
            p,
            g,
            buf,
            lr,
            momentum=d["momentum"],
            dampening=d["dampening"],
            nesterov=d["nesterov"],
            weight_decay=d["weight_decay"],
        )
        p._assign(new_p)
        buf._assign(new_buf)


class Adam(Optimizer):
    decoupled = False

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)

    def step(self) -> None:
        b1, b2 = self.defaults["betas"]
        t = self.steps + 1
        self._bc = (1 - b1**t, 1 - b2**t)
        super().step()

    def _update(self, p: Tensor, g: Tensor) -> None:
        d = self.defaults
        m, v = self._state(p, "m", "v")
        dev = p.device
        lr, bc1, bc2 = (
            dev.scalar(self.lr, "float64"),
            dev.scalar(self._bc[0], "float64"),
            dev.scalar(self._bc[1], "float64"),
        )
        b1, b2 = d["betas"]
        new_p, new_m, new_v = call(
            "adam_update",
            p,
            g,
            m,
            v,
            lr,
            bc1,
            bc2,
            beta1=b1,
            beta2=b2,
            eps=d["eps"],
            weight_decay=d["weight_decay"],
            decoupled=self.decoupled,
        )
        p._assign(new_p)
        m._assign(new_m)
        v._assign(new_v)


class AdamW(Adam):
    decoupled = True

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
