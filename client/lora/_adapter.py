"""PEFT-format adapters: `adapter_model.safetensors` + `adapter_config.json`.

Keys are `base_model.model.<module path>.lora_A.weight` ([r, in]) and `.lora_B.weight`
([out, r]), the layout `peft.PeftModel.from_pretrained` reads; the config carries the fields
PEFT needs to rebuild the LoRA layers. The module path is the one of the Hugging Face class the
base came from: `GPT2LMHeadModel` nests GPT-2 under `transformer.`, so its adapters read
`base_model.model.transformer.h.0...`; PEFT silently ignores keys that do not fit its model (the
adapter then does nothing), so the class matters.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..nn import Module
from ..nn._serialize import load_arrays, save_arrays
from ._config import LoraConfig
from ._model import apply_lora, lora_layers

PREFIX = "base_model.model."
WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"
HF_GPT2_LIBRARY = "transformers.models.gpt2.modeling_gpt2"
"""Where the GPT-2 classes live: `AutoPeftModel*` imports the base class from there."""


def key_prefix(model: Module, hf_class: str | None = None) -> str:
    """`base_model.model.` plus where the Hugging Face class `hf_class` (default: the one
    the model was loaded from, if any) keeps our module tree."""
    own: str | None = getattr(model, "hf_class", None)
    cls = hf_class or own
    if cls is None:
        return PREFIX
    from ..nn._hf import CLASSES
    from ..nn._llm_config import CLASSES as LLM_CLASSES

    if cls in LLM_CLASSES.values():  # our tree is the class's own: model.layers.N...
        if hf_class is not None and hf_class != own:
            is_a = own or type(model).__name__
            raise ValueError(f"save_adapter: this model is a {is_a}, not {hf_class}")
        return PREFIX
    if cls not in CLASSES:
        supported = sorted(CLASSES) + sorted(LLM_CLASSES.values())
        raise ValueError(f"save_adapter: hf_class {cls!r} is not one of {supported}")
    return PREFIX + CLASSES[cls]


def parent_library(hf_class: str) -> str:
    """The transformers module that defines `hf_class` (`AutoPeftModel*` imports it)."""
    from ..nn._llm_config import CLASSES as LLM_CLASSES

    for model_type, cls in LLM_CLASSES.items():
        if cls == hf_class:
            return f"transformers.models.{model_type}.modeling_{model_type}"
    return HF_GPT2_LIBRARY


def adapter_state(model: Module, hf_class: str | None = None) -> dict[str, Any]:
    """The adapters' weights as PEFT names them (``base_model.model.<path>.lora_A.weight``),
    keyed for the Hugging Face class ``hf_class`` (default: the one the model came from)."""
    prefix = key_prefix(model, hf_class)
    out = {}
    for path, layer in lora_layers(model):
        out[f"{prefix}{path}.lora_A.weight"] = layer.lora_A.weight.numpy()
        out[f"{prefix}{path}.lora_B.weight"] = layer.lora_B.weight.numpy()
    return out


def save_adapter(
    model: Module, directory: str | Path, hf_class: str | None = None, **config_fields: Any
) -> None:
    """Write the adapter; `config_fields` override or add adapter_config.json entries.

    Args:
        hf_class: key the adapter for this Hugging Face class ("GPT2LMHeadModel" or the bare
            "GPT2Model"); default the class the model was loaded from (GPT: GPT2LMHeadModel).
    """
    config: LoraConfig | None = getattr(model, "lora_config", None)
    if config is None:
        raise ValueError("save_adapter: this model has no LoRA adapters (apply_lora first)")
    targets: list[str] = getattr(model, "lora_targets", [])  # set with lora_config (apply_lora)
    name_or_path = config.base_model_name_or_path or getattr(model, "name_or_path", None)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_arrays(adapter_state(model, hf_class), directory / WEIGHTS, {"format": "pt"})
    doc = {
        "peft_type": "LORA",
        "task_type": config.task_type,
        "base_model_name_or_path": name_or_path,
        "r": config.r,
        "lora_alpha": config.alpha,
        "lora_dropout": config.dropout,
        "target_modules": config.targets_json(targets),
        "bias": "none",
        "use_rslora": config.use_rslora,
        "fan_in_fan_out": hasattr(model, "save_gpt2"),  # GPT-2's Conv1D layout
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
        "revision": None,
    }
    cls = hf_class or getattr(model, "hf_class", None)
    if config.task_type is None and cls is not None:  # what PEFT writes for task_type None
        doc["auto_mapping"] = {"base_model_class": cls, "parent_library": parent_library(cls)}
    doc.update(config_fields)
    (directory / CONFIG).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def read_config(directory: str | Path) -> LoraConfig:
    """The LoraConfig of a PEFT adapter directory (its ``adapter_config.json``); an adapter
    that is not LoRA is refused."""
    doc = json.loads((Path(directory) / CONFIG).read_text())
    if doc.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"load_adapter: peft_type {doc['peft_type']!r} is not LORA")
    if doc.get("bias", "none") != "none":
        raise ValueError(f"load_adapter: bias {doc['bias']!r} is not supported (only 'none')")
    return LoraConfig(
        r=int(doc["r"]),
        alpha=float(doc["lora_alpha"]),
        dropout=float(doc.get("lora_dropout", 0.0)),
        target_modules=doc["target_modules"],
        use_rslora=bool(doc.get("use_rslora", False)),
        task_type=doc.get("task_type"),
        base_model_name_or_path=doc.get("base_model_name_or_path"),
    )


def load_adapter(model: Module, directory: str | Path) -> None:
    """Load an adapter; a model without LoRA gets it applied from the saved config first."""
    config = read_config(directory)
    if not lora_layers(model):
        apply_lora(model, config)
    prefix = key_prefix(model)
    state = {}
    for key, arr in load_arrays(Path(directory) / WEIGHTS).items():
        # keyed for either Hugging Face class: both load
        key = key.removeprefix(prefix).removeprefix(PREFIX).replace(".default.", ".")
        state[key] = arr
    own = {f"{p}.lora_{ab}.weight" for p, _ in lora_layers(model) for ab in "AB"}
    missing, unexpected = own - state.keys(), state.keys() - own
    if missing or unexpected:
        raise KeyError(f"load_adapter: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    model.load_state_dict(state, strict=False)
