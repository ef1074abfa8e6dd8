"""Writing a Llama-family model as transformers' `save_pretrained` does.

One tensor set per shard is read back from the device at a time, so saving a model that
lives on a RemoteDevice holds at most one shard's arrays in the client.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from burn_remote.protocol import dtypes

from ._hf import CONFIG, WEIGHTS, WEIGHTS_INDEX, HFConfigError

SHARD_BYTES = 4 << 30
"""save_pretrained writes shards of at most about this size (transformers' own default is
larger; 4 GiB keeps one shard's arrays modest while saving from a remote device)."""


def export_state(model: Any) -> dict[str, Any]:
    """transformers' tensors of `model`, without adapters (NF4 bases dequantised), as
    device tensors (read one shard at a time by the writer)."""
    out: dict[str, Any] = {}
    for name, t in model.named_tensors():
        if ".lora_" not in name and name.endswith((".weight", ".bias")):
            out[name] = t
    for path, mod in model.named_modules():
        if getattr(mod, "quantized", False):
            out[f"{path}.weight"] = mod.dense_weight().cast(model.dtype)
    return out


def _shards(state: dict[str, Any]) -> list[list[str]]:
    shards: list[list[str]] = [[]]
    size = 0
    for name, t in state.items():
        n = t.size * dtypes.to_numpy(t.dtype).itemsize
        if shards[-1] and size + n > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    return shards


def save_pretrained(model: Any, directory: str | Path) -> None:
    """config.json + model.safetensors (or shards and their index) as transformers writes."""
    from ._serialize import save_arrays

    if model.hf_config is None:
        raise HFConfigError(
            "save_pretrained: this model has no config.json document; build it with "
            "AutoModelForCausalLM.from_config(...) or from_pretrained(...)"
        )
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = export_state(model)
    shards = _shards(state)
    names = [WEIGHTS] if len(shards) == 1 else [
        f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))
    ]  # fmt: skip
    weight_map: dict[str, str] = {}
    for file, keys in zip(names, shards):
        save_arrays({k: state[k].numpy() for k in keys}, directory / file, {"format": "pt"})
        weight_map.update(dict.fromkeys(keys, file))
    if len(shards) > 1:
        total = sum(t.size * dtypes.to_numpy(t.dtype).itemsize for t in state.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (directory / WEIGHTS_INDEX).write_text(json.dumps(index, indent=2, sort_keys=True))
        (directory / WEIGHTS).unlink(missing_ok=True)
    else:
        (directory / WEIGHTS_INDEX).unlink(missing_ok=True)
    doc = dict(model.hf_config)
    doc.pop("torch_dtype", None)
    doc.update({"architectures": [model.hf_class], "dtype": model.dtype})
    (directory / CONFIG).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
