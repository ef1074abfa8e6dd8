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

import numpy as np

from .._autograd import no_grad
from .._bindings import binding, on_replay
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
        self.defaults = defaults
        self.schedule = schedule
        self.groups: list[Group] = []
        self.state: dict[int, dict[str, Tensor]] = {}
        self.steps = 0
        if isinstance(params, list | tuple) and params and isinstance(params[0], dict):
            self._dict_groups(params)
            return
        named = named_params(params)
        if not named:
            raise ValueError(f"{type(self).__name__}: got no parameters to optimise")
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

    def _dict_groups(self, dicts: Sequence[dict[str, Any]]) -> None:
        """torch's form: `[{"params": [...], "lr": 1e-3}, {"params": [...]}]`."""
        seen: set[int] = set()
        for i, d in enumerate(dicts):
            if "params" not in d:
                raise ValueError(f"{type(self).__name__}: parameter group {i} has no 'params'")
            unknown = d.keys() - self.defaults.keys() - {"params", "name"}
            if unknown:
                raise TypeError(f"parameter group {i}: unknown settings {sorted(unknown)}")
            named = named_params(d["params"])
            if not named:
                raise ValueError(f"{type(self).__name__}: parameter group {i} is empty")
            if any(id(t) in seen for _, t in named):
                raise ValueError("some parameters appear in more than one parameter group")
            seen.update(id(t) for _, t in named)
            settings = {
                **self.defaults,
                **{k: v for k, v in d.items() if k not in ("params", "name")},
            }
            self.groups.append(Group(d.get("name", f"group{i}"), named, settings))

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """Each group's settings as a dict, as torch's: `g["lr"] = ...` changes the lr the
        next step uses (a binding, so the step graph stays the same)."""
        return [g.settings for g in self.groups]

    # --- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """torch's layout: `state` keyed by parameter index (in group order), each slot a
        NumPy array, and `param_groups` with their settings and parameter indices."""
        state, groups, index = {}, [], 0
        for g in self.groups:
            ids = []
            for _, p in g.params:
                slots = self.state.get(id(p))
                if slots:
                    state[index] = {k: t.numpy() for k, t in slots.items()}
                ids.append(index)
                index += 1
            groups.append({**g.settings, "name": g.name, "params": ids})
        return {"state": state, "param_groups": groups, "steps": self.steps}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume: slots go to this optimizer's parameters by position, settings by group.

        Raises:
            ValueError: the groups or parameter shapes do not match this optimizer's.
        """
        groups = state_dict["param_groups"]
        if len(groups) != len(self.groups):
            raise ValueError(
                f"load_state_dict: {len(groups)} parameter groups, this optimizer has "
                f"{len(self.groups)}"
            )
        params = [p for g in self.groups for _, p in g.params]
        for mine, theirs in zip(self.groups, groups):
            if len(theirs["params"]) != len(mine.params):
                raise ValueError(
                    f"load_state_dict: group {mine.name!r} has {len(mine.params)} parameters, "
                    f"the state has {len(theirs['params'])}"
                )
        new_state = {}
        for index, slots in state_dict["state"].items():
            p = params[int(index)]
            for name, arr in slots.items():
                if tuple(np.shape(arr)) != p.shape:
                    raise ValueError(
                        f"load_state_dict: slot {name!r} of parameter {index} has shape "
                        f"{np.shape(arr)}, the parameter {p.shape}"
                    )
            new_state[id(p)] = {
                k: p.device.tensor(np.asarray(v), dtype=p.dtype) for k, v in slots.items()
            }
        for mine, theirs in zip(self.groups, groups):
            mine.settings.update({k: v for k, v in theirs.items() if k not in ("params", "name")})
        self.state = new_state
        self.steps = int(state_dict.get("steps", 0))

    # --- groups -----------------------------------------------------------------------------
    def group(self, name: str) -> Group:
        """The parameter group called ``name`` (KeyError naming the groups otherwise)."""
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(f"no parameter group {name!r}; have {[g.name for g in self.groups]}")

    def freeze(self, name: str) -> None:
        """Stop updating (and differentiating) the group's parameters."""
        _set_trainable(self.group(name).params, False)

    def unfreeze(self, name: str) -> None:
        """Update (and differentiate) the group's parameters again."""
        _set_trainable(self.group(name).params, True)

    @property
    def params(self) -> list[Tensor]:
        """Every parameter the optimizer updates, group by group."""
        return [t for g in self.groups for _, t in g.params]

    def lr_of(self, group: Group | None = None) -> float:
        """The learning rate the next step uses (base lr times the schedule)."""
        g = group or self.groups[0]
        factor = self.schedule(self.steps) if self.schedule is not None else 1.0
        return g.settings["lr"] * factor

    @property
    def lr(self) -> float:
        """The learning rate the next step uses in the first group (`lr_of`)."""
        return self.lr_of()

    # --- stepping ---------------------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the parameters' gradients (``set_to_none`` is accepted for torch code; they always
        become None)."""
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
        """Record one update of every parameter that has a gradient (one graph with the step's
        forward and backward)."""
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
