"""Module: a tree of named parameters, like PyTorch's, on whatever device it is moved to."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from .._device import Device
from .._tensor import Tensor


class Module:
    """Attributes that are Tensors are parameters (trainable when they require gradients);
    attributes that are Modules are children. Names are dotted paths: `layers.0.weight`."""

    training: bool = True

    def __setattr__(self, name: str, value: Any) -> None:
        d = self.__dict__
        if isinstance(value, Tensor):
            d.setdefault("_params", {})[name] = value
            d.get("_children", {}).pop(name, None)
        elif isinstance(value, Module):
            d.setdefault("_children", {})[name] = value
            d.get("_params", {}).pop(name, None)
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        self.__dict__.get("_params", {}).pop(name, None)
        self.__dict__.get("_children", {}).pop(name, None)
        object.__delattr__(self, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    # --- the tree -------------------------------------------------------------------------
    def named_children(self) -> Iterator[tuple[str, Module]]:
        yield from self.__dict__.get("_children", {}).items()

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        yield prefix, self
        for name, child in self.named_children():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def named_tensors(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        """Every tensor attribute, trainable or not (state_dict order)."""
        for mod_name, mod in self.named_modules(prefix):
            for name, t in mod.__dict__.get("_params", {}).items():
                yield (f"{mod_name}.{name}" if mod_name else name), t

    def named_parameters(self) -> Iterator[tuple[str, Tensor]]:
        """Trainable tensors only (those that require gradients)."""
        return ((n, t) for n, t in self.named_tensors() if t.requires_grad)

    def parameters(self) -> list[Tensor]:
        return [t for _, t in self.named_parameters()]

    # --- devices, modes, state --------------------------------------------------------------
    def to(self, device: Device | str) -> Module:
        """Move every tensor to `device`, keeping the same tensor objects."""
        dev = Device.parse(device) if isinstance(device, str) else device
        for _, t in self.named_tensors():
            if t.device is not dev:
                t._assign(t.to(dev))
        return self

    def train(self, mode: bool = True) -> Module:
        for _, m in self.named_modules():
            m.training = mode
        return self

    def eval(self) -> Module:
        return self.train(False)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {name: t.numpy() for name, t in self.named_tensors()}

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Copy arrays into this module's tensors; names and shapes must agree."""
        own = dict(self.named_tensors())
        if strict:
            missing, unexpected = own.keys() - state.keys(), state.keys() - own.keys()
            if missing or unexpected:
                raise KeyError(
                    f"load_state_dict: missing {sorted(missing)}, unexpected {sorted(unexpected)}"
                )
        for name, value in state.items():
            if name not in own:
                continue
            t = own[name]
            arr = np.asarray(value)
            if tuple(arr.shape) != t.shape:
                raise ValueError(
                    f"load_state_dict: {name} has shape {arr.shape}, expected {t.shape}"
                )
            t._assign(t.device.tensor(arr, dtype=t.dtype))


class Sequential(Module):
    def __init__(self, *modules: Module) -> None:
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __iter__(self) -> Iterator[Module]:
        return iter(m for _, m in self.named_children())

    def __getitem__(self, i: int) -> Module:
        return list(self)[i]

    def __len__(self) -> int:
        return len(list(self.named_children()))

    def forward(self, x: Any) -> Any:
        for m in self:
            x = m(x)
        return x


class ModuleList(Module):
    def __init__(self, modules: Iterable[Module] = ()) -> None:
        for m in modules:
            self.append(m)

    def append(self, m: Module) -> None:
        setattr(self, str(len(self)), m)

    def __iter__(self) -> Iterator[Module]:
        return iter(m for _, m in self.named_children())

    def __getitem__(self, i: int) -> Module:
        return list(self)[i]

    def __len__(self) -> int:
        return len(self.__dict__.get("_children", {}))
