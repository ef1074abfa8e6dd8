"""Module: a tree of named parameters and buffers, like PyTorch's, on any device.

Parameters are Tensor attributes (trainable while they require gradients, frozen otherwise);
buffers are tensors a module needs but never trains (a causal mask, position ids, quantised
codes). Names are dotted paths (`h.0.attn.c_attn.weight`), the keys of `state_dict` and of
the safetensors files that `save` writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

import numpy as np

from .._device import Device
from .._recorder import structure_changed
from .._tensor import Tensor


class Module:
    """Tensor attributes are parameters, `register_buffer` adds buffers, Module attributes are
    children. A frozen parameter (requires_grad False) stays a parameter: it is saved, moved
    and can be unfrozen, but optimizers skip it."""

    training: bool = True

    def __setattr__(self, name: str, value: Any) -> None:
        d = self.__dict__
        buffers = d.get("_buffers", {})
        if isinstance(value, Tensor) and name in buffers:
            buffers[name] = value
        elif isinstance(value, Tensor):
            d.setdefault("_params", {})[name] = value
            d.get("_children", {}).pop(name, None)
        elif isinstance(value, Module):
            d.setdefault("_children", {})[name] = value
            d.get("_params", {}).pop(name, None)
        elif value is None:
            d.get("_params", {}).pop(name, None)
            d.get("_children", {}).pop(name, None)
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        for key in ("_params", "_children", "_buffers"):
            self.__dict__.get(key, {}).pop(name, None)
        self.__dict__.get("_transient", set()).discard(name)
        object.__delattr__(self, name)

    def register_buffer(self, name: str, tensor: Tensor, persistent: bool = True) -> None:
        """Keep `tensor` with the module (moved by `to`); `persistent` buffers are saved too."""
        self.__dict__.get("_params", {}).pop(name, None)
        self.__dict__.setdefault("_buffers", {})[name] = tensor
        if not persistent:
            self.__dict__.setdefault("_transient", set()).add(name)
        object.__setattr__(self, name, tensor)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        """The settings `print(model)` shows beside the class name (as torch's)."""
        return ""

    def __repr__(self) -> str:
        head = f"{type(self).__name__}({self.extra_repr()}"
        children = list(self.named_children())
        if not children:
            return head + ")"
        lines = [f"  ({name}): " + repr(child).replace("\n", "\n  ") for name, child in children]
        return head + "\n" + "\n".join(lines) + "\n)"

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """What the module computes; subclasses define it and `module(x)` calls it."""
        raise NotImplementedError

    # --- the tree -------------------------------------------------------------------------
    def named_children(self) -> Iterator[tuple[str, Module]]:
        """(name, module) of the direct children, in the order they were set."""
        yield from list(self.__dict__.get("_children", {}).items())

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """(dotted path, module) of this module and every descendant, depth first."""
        yield prefix, self
        for name, child in self.named_children():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def children(self) -> Iterator[Module]:
        """The direct child modules."""
        return (m for _, m in self.named_children())

    def modules(self) -> Iterator[Module]:
        """This module and every descendant."""
        return (m for _, m in self.named_modules())

    def zero_grad(self) -> None:
        """Forget every parameter's gradient (frozen ones included)."""
        for _, t in self.named_parameters(include_frozen=True):
            t.grad = None

    def get_submodule(self, path: str) -> Module:
        """The descendant at a dotted path such as ``"blocks.0.attn"``."""
        mod = self
        for part in filter(None, path.split(".")):
            mod = mod.__dict__.get("_children", {})[part]
        return mod

    def _named(self, kinds: tuple[str, ...], persistent_only: bool) -> Iterator[tuple[str, Tensor]]:
        for mod_name, mod in self.named_modules():
            transient = mod.__dict__.get("_transient", set())
            for kind in kinds:
                for name, t in mod.__dict__.get(kind, {}).items():
                    if t is None or (persistent_only and name in transient):
                        continue
                    yield (f"{mod_name}.{name}" if mod_name else name), t

    def named_tensors(self) -> Iterator[tuple[str, Tensor]]:
        """Parameters (frozen or not) and persistent buffers: exactly what `state_dict` holds."""
        return self._named(("_params", "_buffers"), persistent_only=True)

    def named_buffers(self) -> Iterator[tuple[str, Tensor]]:
        """(dotted name, tensor) of every buffer (running statistics...), transient ones too."""
        return self._named(("_buffers",), persistent_only=False)

    def named_parameters(self, include_frozen: bool = False) -> Iterator[tuple[str, Tensor]]:
        """Trainable parameters; with `include_frozen`, frozen ones too (to unfreeze later)."""
        for name, t in self._named(("_params",), persistent_only=False):
            if include_frozen or t.requires_grad:
                yield name, t

    def parameters(self, include_frozen: bool = False) -> list[Tensor]:
        """The trainable parameters (what an optimizer takes); frozen ones too on request."""
        return [t for _, t in self.named_parameters(include_frozen)]

    def num_parameters(self, trainable_only: bool = False) -> int:
        """How many numbers the parameters hold (only the trainable ones on request)."""
        return sum(t.size for _, t in self.named_parameters(include_frozen=not trainable_only))

    # --- devices, modes ---------------------------------------------------------------------
    def to(self, device: Device | str) -> Module:
        """Move every parameter and buffer to `device`, keeping the same tensor objects."""
        from .._creation import device as _device

        dev = _device(device)
        for _, t in self._named(("_params", "_buffers"), persistent_only=False):
            if t.device is not dev:
                t._assign(t.to(dev))
        return self

    @property
    def device(self) -> Device:
        """The device the module's tensors are on (the CPU for a module without any)."""
        for _, t in self._named(("_params", "_buffers"), persistent_only=False):
            return t.device
        return Device.cpu()

    def train(self, mode: bool = True) -> Module:
        """Training mode (dropout on, batch statistics) for this module and its children;
        ``train(False)`` is ``eval()``. A change makes compiled steps capture again."""
        changed = False
        for _, m in self.named_modules():
            changed = changed or m.training != mode
            m.training = mode
        if changed:  # compiled steps capture again (dropout on or off)
            structure_changed()
        return self

    def eval(self) -> Module:
        """Inference mode: dropout off, running statistics used."""
        return self.train(False)

    # --- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        """Every parameter and persistent buffer as a NumPy array, by dotted name (reads the
        device): what ``save`` writes and ``load_state_dict`` takes back."""
        return {name: t.numpy() for name, t in self.named_tensors()}

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Copy arrays into this module's tensors (same objects, so optimizers keep them)."""
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

    def save(self, path: str | Path, metadata: dict[str, str] | None = None) -> None:
        """Write `state_dict()` as safetensors (no pickle: a header and raw little-endian data)."""
        from ._serialize import save_arrays

        save_arrays(self.state_dict(), path, metadata)

    def load(self, path: str | Path, strict: bool = True) -> None:
        """Read a safetensors file written by ``save`` (or any with the same names) into
        this module's tensors; ``strict`` refuses missing or unexpected names."""
        from ._serialize import load_arrays

        self.load_state_dict(load_arrays(path), strict=strict)

    # --- LoRA (lives in burn_remote.lora; these are the entry points people look for) -------
    # lora builds on nn (its layers wrap Linear), so nn never imports it: these methods reach
    # it through the package's public lazy attribute (`_lora`), as a user's code does.
    def apply_lora(self, config: Any) -> Module:
        """Wrap the targeted Linear layers with LoRA adapters and freeze everything else."""
        return _lora().apply_lora(self, config)

    def merge_lora(self) -> None:
        """Add each adapter's update into its base weight (faster inference, same outputs)."""
        _lora().merge(self)

    def merge_and_unload(self) -> Module:
        """Fold the adapters into the base weights and drop them (PEFT's name)."""
        return _lora().merge_and_unload(self)

    def unmerge_lora(self) -> None:
        """Take merged adapter updates back out of the base weights (to train them again)."""
        _lora().unmerge(self)

    def save_adapter(
        self, directory: str | Path, hf_class: str | None = None, **config_fields: Any
    ) -> None:
        """PEFT's layout, keyed for `hf_class` (default: the class the model came from)."""
        _lora().save_adapter(self, directory, hf_class, **config_fields)

    def load_adapter(self, directory: str | Path) -> None:
        """Load a PEFT adapter directory (``adapter_config.json`` and its weights) onto
        this model, wrapping the layers it targets."""
        _lora().load_adapter(self, directory)


class Sequential(Module):
    """Children named 0, 1, 2 ... applied in order."""

    def __init__(self, *modules: Module) -> None:
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __iter__(self) -> Iterator[Module]:
        return iter(m for _, m in self.named_children())

    def __getitem__(self, i: int) -> Module:
        return list(self)[i]

    def __len__(self) -> int:
        return len(self.__dict__.get("_children", {}))

    def forward(self, x: Any) -> Any:
        """Call each child in order, each one's output the next one's input; returns the last output
        (``x`` itself when the container is empty)."""
        for m in self:
            x = m(x)
        return x


ChildT = TypeVar("ChildT", bound=Module)
"""The kind of module a ModuleList holds (its blocks are usually all of one class)."""


class ModuleList(Module, Generic[ChildT]):
    """A list of children named by position, for blocks that a parent applies itself."""

    def __init__(self, modules: Iterable[ChildT] = ()) -> None:
        for m in modules:
            self.append(m)

    def append(self, m: ChildT) -> None:
        """Add ``m`` as the next child (named by its position)."""
        setattr(self, str(len(self)), m)

    def __iter__(self) -> Iterator[ChildT]:
        # (every child came through `append`, or a setattr the caller typed the same way)
        return iter(cast(ChildT, m) for _, m in self.named_children())

    def __getitem__(self, i: int) -> ChildT:
        return list(self)[i]

    def __len__(self) -> int:
        return len(self.__dict__.get("_children", {}))


def _lora() -> Any:
    """`burn_remote.lora`, loaded on first use through the package root's table of lazy
    names (the root sits above both nn and lora)."""
    import burn_remote

    return burn_remote.lora
