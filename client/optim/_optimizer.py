"""The optimizer base: parameter groups, freezing, and per-step bindings.

Each step records one fused update op per trainable parameter. Numbers that change from step
to step (the scheduled learning rate, bias corrections) are bindings shared by a group's
parameters, so step 1000 replays the graph that step 2 registered. Each binding carries the
function that computes it from the step counter, and the counter's increment is a replay
effect, so a step captured by `br.compile` computes the same numbers on every replay.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._autograd import no_grad
from .._compile import binding, on_replay
from .._tensor import Tensor
from ._groups import Named, ParamGroup, _set_trainable, named_params
from ._schedule import Schedule


@dataclass
class Group:
    """A group as the optimizer holds it: its name, parameters and effective settings."""

    name: str
    params: Named
    settings: dict[str, Any]
    spec: ParamGroup | None = None
    bindings: dict[Any, dict[str, Tensor]] = field(default_factory=dict)


class Optimizer:
    """`params`: a Module (names let groups select; frozen parameters are kept so they can be
    unfrozen), (name, tensor) pairs, or tensors. `groups`: ParamGroups matched in order,
    first match wins; the rest form the group "default" with the constructor's settings."""

    def __init__(
        self,
        params: Any,
        groups: Sequence[ParamGroup] = (),
        schedule: Schedule | None = None,
        **defaults: Any,
    ) -> None:
        named = named_params(params)
        if not named:
            raise ValueError(f"{type(self).__name__}: got no parameters to optimise")
        self.defaults = defaults
        self.schedule = schedule
        self.groups: list[Group] = []
        taken: set[int] = set()
        for spec in groups:
            unknown = spec.settings.keys() - defaults.keys()
            if unknown:
                raise TypeError(f"{spec!r}: unknown settings {sorted(unknown)}")
            chosen = [(n, t) for n, t in named if id(t) not in taken and spec.matches(n, t)]
            if not chosen:
                raise ValueError(f"{type(self).__name__}: {spec!r} selects no parameter")
            taken.update(id(t) for _, t in chosen)
            self.groups.append(Group(spec.name, chosen, {**defaults, **spec.settings}, spec))
        rest = [(n, t) for n, t in named if id(t) not in taken]
        if rest:
            self.groups.append(Group("default", rest, dict(defaults)))
        self.state: dict[int, dict[str, Tensor]] = {}
        self.steps = 0

    # --- groups -----------------------------------------------------------------------------
    def group(self, name: str) -> Group:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(f"no parameter group {name!r}; have {[g.name for g in self.groups]}")

    def freeze(self, name: str) -> None:
        """Stop updating (and differentiating) the group's parameters."""
        _set_trainable(self.group(name).params, False)

    def unfreeze(self, name: str) -> None:
        _set_trainable(self.group(name).params, True)

    @property
    def params(self) -> list[Tensor]:
        return [t for g in self.groups for _, t in g.params]

    def lr_of(self, group: Group | None = None) -> float:
        """The learning rate the next step uses (base lr times the schedule)."""
        g = group or self.groups[0]
        factor = self.schedule(self.steps) if self.schedule is not None else 1.0
        return g.settings["lr"] * factor

    @property
    def lr(self) -> float:
        return self.lr_of()

    # --- stepping ---------------------------------------------------------------------------
    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def _state(self, p: Tensor, *names: str) -> list[Tensor]:
        st = self.state.get(id(p))
        if st is None:
            st = self.state[id(p)] = {n: p.device.zeros(p.shape, p.dtype) for n in names}
        return [st[n] for n in names]

    def _binding(self, group: Group, p: Tensor, name: str, value: Callable[[], float]) -> Tensor:
        """One 0-d binding per (group, device, name) per step, shared by the group. `value`
        computes it from the step counter, now and on every replay of a compiled step."""
        per_dev = group.bindings.setdefault(p.device, {})
        t = per_dev.get(name)
        if t is None:
            t = per_dev[name] = binding(p.device, value, "float64")
        return t

    def step(self) -> None:
        with no_grad():
            for group in self.groups:
                group.bindings.clear()
                for _, p in group.params:
                    if p.requires_grad and p.grad is not None:
                        self._update(p, p.grad, group)
                group.bindings.clear()
        self.steps += 1
        on_replay(self._advance)

    def _advance(self) -> None:
        self.steps += 1

    def _lr(self, group: Group, p: Tensor) -> Tensor:
        """The group's scheduled learning rate as a binding."""
        return self._binding(group, p, "lr", lambda: self.lr_of(group))

    def _update(self, p: Tensor, g: Tensor, group: Group) -> None:
        raise NotImplementedError
