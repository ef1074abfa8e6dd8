"""LoraConfig: the knobs of PEFT's LoraConfig that this implementation honours."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any


@dataclass
class LoraConfig:
    """`target_modules`: PEFT module names (a name matches a module path equal to it or ending
    in `.<name>`), a regex string or compiled pattern (full match, as PEFT), or a ParamGroup
    (a Linear is targeted when its `<path>.weight` is selected). `quantize="nf4"` gives QLoRA:
    the frozen base weights of targeted layers are stored as double-quantised NF4."""

    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: Any = ("q_proj", "v_proj")
    use_rslora: bool = False
    quantize: str | None = None
    task_type: str | None = None
    """As PEFT's default (None): the adapter loads onto any model, `PeftModel` or a task
    class; set "CAUSAL_LM" for `PeftModelForCausalLM`."""
    base_model_name_or_path: str | None = None
    """Default: the directory the model was loaded from (`GPT.from_pretrained`)."""

    def __post_init__(self) -> None:
        if self.r <= 0:
            raise ValueError(f"LoraConfig: r must be positive, got {self.r}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"LoraConfig: dropout must be in [0, 1), got {self.dropout}")
        if self.quantize not in (None, "nf4"):
            raise ValueError(f"LoraConfig: quantize must be None or 'nf4', got {self.quantize!r}")

    @property
    def scaling(self) -> float:
        """alpha / r, or alpha / sqrt(r) with rsLoRA (stable updates at large ranks)."""
        return self.alpha / (math.sqrt(self.r) if self.use_rslora else self.r)

    def targets_json(self, matched: list[str]) -> str | list[str]:
        """target_modules as adapter_config.json holds it (PEFT reads a list or a regex)."""
        t = self.target_modules
        if isinstance(t, str):
            return t
        if isinstance(t, re.Pattern):
            return t.pattern
        if isinstance(t, list | tuple | set | frozenset):
            return sorted(t)
        return sorted(matched)
