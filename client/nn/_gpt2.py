"""GPT-2 checkpoint format: key names, Conv1D layouts and the tied head.

Hugging Face's GPT-2 stores its projections as Conv1D, weight (in, out), the transpose of
our Linear's (out, in); the LM head is tied to `wte` and not stored. Files written by
`transformers` may prefix keys with `transformer.` and carry the old `attn.bias` mask
buffers; both are accepted on load.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from ._serialize import load_arrays, load_metadata, save_arrays

_CONV1D = re.compile(r"^h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$")
_IGNORED = re.compile(r"^(h\.\d+\.attn\.(bias|masked_bias)|lm_head\.weight)$")


def gpt2_state(model: Any) -> dict[str, np.ndarray]:
    """Our state_dict in GPT-2 form: adapters left out, NF4 bases dequantised, Conv1D
    weights transposed."""
    out = {
        name: t.numpy()
        for name, t in model.named_tensors()
        if ".lora_" not in name and name.endswith((".weight", ".bias"))
    }
    for path, mod in model.named_modules():
        if getattr(mod, "quantized", False):
            out[f"{path}.weight"] = mod.dense_weight().numpy()
    return {k: (v.T.copy() if _CONV1D.match(k) else v) for k, v in out.items()}


def save_gpt2(model: Any, path: str | Path) -> None:
    meta = {"format": "pt", **{k: str(v) for k, v in model.config_dict().items()}}
    save_arrays(gpt2_state(model), path, meta)


def _normalise(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {}
    for key, arr in state.items():
        key = key.removeprefix("transformer.")
        if _IGNORED.match(key):
            continue
        out[key] = arr.T if _CONV1D.match(key) else arr
    return out


def load_gpt2(model: Any, path: str | Path) -> None:
    """Load a GPT-2 file into `model` (same sizes); LoRA adapters, if any, are kept."""
    load_state(model, load_arrays(path), path)


def load_state(model: Any, raw: dict[str, np.ndarray], where: Any) -> None:
    state = _normalise(raw)
    own = {n for n, _ in model.named_tensors() if ".lora_" not in n}
    missing = own - state.keys()
    if missing:
        raise KeyError(f"load_gpt2: {where} lacks {sorted(missing)}")
    model.load_state_dict(state, strict=False)


def config_from_file(path: str | Path, n_head: int | None = None) -> Any:
    """Sizes from the shapes; heads and the rest from our metadata, else `n_head`. A file
    that names no head count is refused: guessing one gives wrong logits silently."""
    from ._gpt_config import GPTConfig

    state = _normalise(load_arrays(path))
    meta = load_metadata(path)
    vocab, d_model = state["wte.weight"].shape
    n_layer = 1 + max(int(k.split(".")[1]) for k in state if k.startswith("h."))
    if n_head is None:
        if "n_head" not in meta:
            raise ValueError(
                f"{path}: the file does not say how many attention heads the model has; "
                "load its save_pretrained directory (config.json) or pass n_head="
            )
        n_head = int(meta["n_head"])
    return GPTConfig(
        n_layer=n_layer,
        n_head=n_head,
        d_model=d_model,
        vocab=vocab,
        context=state["wpe.weight"].shape[0],
        eps=float(meta.get("eps", 1e-5)),
        activation=meta.get("activation", "gelu_new"),
    )
