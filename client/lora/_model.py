"""Applying LoRA to a model: finding targets, wrapping them, merging, counting.

As PEFT does (bias "none"), applying LoRA freezes every parameter of the model and leaves
only the adapters trainable; `ParamGroup.unfreeze` brings others back if wanted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..nn import Linear, Module
from ._config import LoraConfig
from ._layer import LoraLinear

ALL_LINEAR = "all-linear"
"""PEFT's shorthand: every Linear layer but the model's output layer (the LM head)."""


def output_layer(model: Module) -> str | None:
    """The path of the output layer that "all-linear" leaves out, as PEFT does for
    transformers models (their `lm_head`); None when the model has none as a Linear."""
    head = model.__dict__.get("_children", {}).get("lm_head")
    return "lm_head" if isinstance(head, Linear) else None


def _suffix_match(path: str, name: str) -> bool:
    return path == name or path.endswith("." + name)


def find_targets(model: Module, target: Any) -> list[str]:
    """Paths of the Linear layers `target` selects (see LoraConfig), in model order."""
    from ..optim import ParamGroup

    out = []
    head = output_layer(model)
    for path, mod in model.named_modules():
        if not path or not isinstance(mod, Linear) or ".lora_" in f".{path}":
            continue
        if isinstance(target, str) and target.lower() == ALL_LINEAR:
            hit = path != head
        elif isinstance(target, ParamGroup):
            hit = target.matches(f"{path}.weight", mod.weight)
        elif isinstance(target, re.Pattern):
            hit = target.fullmatch(path) is not None
        elif isinstance(target, str):
            hit = _suffix_match(path, target) or re.fullmatch(target, path) is not None
        else:
            hit = any(_suffix_match(path, t) for t in target)
        if hit:
            out.append(path)
    return out


def _unmatched_names(model: Module, target: Any) -> list[str]:
    """The names of a list of targets that select no Linear layer (a typo such as
    ``c_atn``); a single string or pattern is one rule, checked as a whole above."""
    if isinstance(target, str | re.Pattern) or not isinstance(target, list | tuple | set):
        return []
    return [t for t in target if not find_targets(model, [t])]


def lora_layers(model: Module) -> list[tuple[str, LoraLinear]]:
    """(path, layer) of every LoRA-wrapped Linear of ``model``, in model order."""
    return [(p, m) for p, m in model.named_modules() if isinstance(m, LoraLinear)]


def apply_lora(model: Module, config: LoraConfig) -> Module:
    """Wrap every targeted Linear in a LoraLinear; freeze all non-adapter parameters."""
    if lora_layers(model):
        raise ValueError("apply_lora: this model already has LoRA adapters")
    targets = find_targets(model, config.target_modules)
    if not targets:
        raise ValueError(
            f"apply_lora: target_modules {config.target_modules!r} matches no Linear layer"
        )
    unmatched = _unmatched_names(model, config.target_modules)
    if unmatched:  # PEFT trains the names that match; a typo would narrow training unseen
        raise ValueError(
            f"apply_lora: target_modules {', '.join(map(repr, unmatched))} match no Linear "
            f"layer (the others would train alone); Linear layers: "
            f"{', '.join(sorted({p.rsplit('.', 1)[-1] for p in find_targets(model, 'all-linear')}))}"
        )
    for _, t in model.named_parameters():
        t.requires_grad_(False)
        t.grad = None
    for path in targets:
        parent_path, _, attr = path.rpartition(".")
        parent = model.get_submodule(parent_path)
        setattr(parent, attr, LoraLinear(getattr(parent, attr), config))
    object.__setattr__(model, "lora_config", config)
    object.__setattr__(model, "lora_targets", targets)
    return model


def merge_and_unload(model: Module) -> Module:
    """Fold every adapter into its base weight and put plain Linear layers back, as PEFT's
    `merge_and_unload`: the model is then the base architecture again (`save_pretrained`
    writes a checkpoint transformers loads). An NF4 base is dequantised first, so the merged
    layer is dense in the model's compute dtype."""
    for path, layer in lora_layers(model):
        parent_path, _, attr = path.rpartition(".")
        setattr(model.get_submodule(parent_path), attr, layer.merged_linear())
    for name in ("lora_config", "lora_targets"):
        model.__dict__.pop(name, None)
    return model


def merge(model: Module) -> None:
    """Add every adapter's update into its base weight (inference without the extra
    matmuls); ``unmerge`` takes it out again."""
    for _, layer in lora_layers(model):
        layer.merge()


def unmerge(model: Module) -> None:
    """Take every merged adapter's update back out of its base weight."""
    for _, layer in lora_layers(model):
        layer.unmerge()


@dataclass(frozen=True)
class LoraStats:
    """What an adapter costs: trainable share and storage of the targeted base weights."""

    trainable: int
    total: int
    base_params: int
    """Elements of the targeted base weights."""
    base_bytes: int
    """Bytes those weights take as stored (float32, or NF4 + double-quantised scales)."""

    @property
    def trainable_share(self) -> float:
        """Trainable parameters over all of them, in [0, 1] (PEFT prints it as a percentage)."""
        return self.trainable / self.total

    @property
    def bytes_per_base_param(self) -> float:
        """Storage per element of the targeted base weights: 4.0 for float32, ~0.516 under NF4."""
        return self.base_bytes / self.base_params

    def __str__(self) -> str:
        return (
            f"trainable {self.trainable:,} of {self.total:,} ({100 * self.trainable_share:.2f}%), "
            f"{self.bytes_per_base_param:.4f} bytes per targeted base parameter"
        )


def lora_stats(model: Module) -> LoraStats:
    """Counts like PEFT's print_trainable_parameters (NF4 bases count as parameters)."""
    trainable = model.num_parameters(trainable_only=True)
    layers = lora_layers(model)
    quant = sum(m.base_numel() for _, m in layers if m.quantized)
    return LoraStats(
        trainable=trainable,
        total=model.num_parameters() + quant,
        base_params=sum(m.base_numel() for _, m in layers),
        base_bytes=sum(m.base_nbytes() for _, m in layers),
    )
