"""LoRA and QLoRA: low-rank adapters on frozen (optionally NF4) Linear layers, saved in the
PEFT layout so the usual tooling reads them."""

from ._adapter import adapter_state, load_adapter, read_config, save_adapter
from ._config import LoraConfig
from ._layer import LoraLinear
from ._model import (
    LoraStats,
    apply_lora,
    find_targets,
    lora_layers,
    lora_stats,
    merge,
    merge_and_unload,
    unmerge,
)
from ._quant import NF4_HALF_GAP, SCALE_BLOCK, NF4Weight

__all__ = [
    "NF4_HALF_GAP",
    "SCALE_BLOCK",
    "LoraConfig",
    "LoraLinear",
    "LoraStats",
    "NF4Weight",
    "adapter_state",
    "apply_lora",
    "find_targets",
    "load_adapter",
    "lora_layers",
    "lora_stats",
    "merge",
    "merge_and_unload",
    "read_config",
    "save_adapter",
    "unmerge",
]
