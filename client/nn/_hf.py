"""Hugging Face GPT-2 directories: `config.json` + `model.safetensors`, both ways.

`save_pretrained` in transformers writes a directory whose `config.json` holds every
hyperparameter; reading heads, epsilon or the activation from anywhere else (tensor shapes, a
guess) gives wrong logits without an error. So a directory is read through its config, and
every config field that would change the numbers is either honoured or refused by name.

Which Hugging Face class the weights came from decides the key prefix: `GPT2LMHeadModel`
stores `transformer.h.0...` (and PEFT adapters for it `base_model.model.transformer.h.0...`),
the bare `GPT2Model` stores `h.0...`. The model remembers the class, so its adapters and its
re-saved checkpoints load back into the same class.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
LM_HEAD = "GPT2LMHeadModel"
BARE = "GPT2Model"
CLASSES = {LM_HEAD: "transformer.", BARE: ""}
"""Supported Hugging Face classes -> the prefix of their GPT-2 keys."""

ACTIVATIONS = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}
"""config.json activation_function -> our GELU form (`F.gelu(approximate=...)`)."""


class HFConfigError(ValueError):
    """A config.json asks for something this GPT does not implement; names the field."""


def read_config(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"{directory}: no {CONFIG} (a save_pretrained directory has one)")
    return json.loads(path.read_text())


def _refuse(path: Any, field: str, value: Any, why: str) -> HFConfigError:
    return HFConfigError(f"{path}: {field}={value!r} is not supported ({why})")


def gpt_config(doc: dict[str, Any], where: Any = CONFIG) -> Any:
    """GPTConfig from a GPT-2 config.json; refuses fields that would change the numbers."""
    from ._gpt_config import GPTConfig

    if doc.get("model_type", "gpt2") != "gpt2":
        raise _refuse(where, "model_type", doc.get("model_type"), "only GPT-2 checkpoints load")
    d_model, n_head = int(doc["n_embd"]), int(doc["n_head"])
    act = doc.get("activation_function", "gelu_new")
    if act not in ACTIVATIONS:
        raise _refuse(where, "activation_function", act, f"supported: {sorted(ACTIVATIONS)}")
    checks = (
        ("n_inner", doc.get("n_inner"), (None, 4 * d_model), "the MLP is 4 * n_embd wide"),
        ("scale_attn_weights", doc.get("scale_attn_weights", True), (True,), "scores / sqrt(d)"),
        ("scale_attn_by_inverse_layer_idx", doc.get("scale_attn_by_inverse_layer_idx", False),
         (False,), "no per-layer score scaling"),
        ("add_cross_attention", doc.get("add_cross_attention", False), (False,), "decoder only"),
        ("tie_word_embeddings", doc.get("tie_word_embeddings", True), (True,), "the head is wte"),
    )  # fmt: skip
    for field, value, allowed, why in checks:
        if value not in allowed:
            raise _refuse(where, field, value, why)
    drops = {doc.get(k, 0.1) for k in ("attn_pdrop", "resid_pdrop", "embd_pdrop")}
    if len(drops) != 1:
        raise _refuse(where, "attn_pdrop/resid_pdrop/embd_pdrop", sorted(drops), "one rate")
    return GPTConfig(
        n_layer=int(doc["n_layer"]),
        n_head=n_head,
        d_model=d_model,
        vocab=int(doc["vocab_size"]),
        context=int(doc["n_positions"]),
        dropout=float(drops.pop()),
        eps=float(doc.get("layer_norm_epsilon", 1e-5)),
        activation=act,
    )


def class_of(doc: dict[str, Any]) -> str:
    """The class the directory was saved from (GPT2LMHeadModel when the config names none)."""
    archs = doc.get("architectures") or [LM_HEAD]
    name = archs[0]
    if name not in CLASSES:
        raise _refuse(CONFIG, "architectures", archs, f"supported: {sorted(CLASSES)}")
    return name


def build(
    cls: Any,
    doc: dict[str, Any],
    state: dict[str, Any],
    device: Any,
    hf_class: str | None,
    where: Any = CONFIG,
    **replace: Any,
) -> Any:
    """A GPT (class `cls`) from a config.json document and its GPT-2 arrays, in eval mode.
    `replace`: GPTConfig fields to override (a job's dropout)."""
    import dataclasses

    from ._gpt2 import load_state

    model = cls(dataclasses.replace(gpt_config(doc, where), **replace), device)
    model.hf_class = hf_class or class_of(doc)
    if model.hf_class not in CLASSES:
        raise ValueError(f"hf_class must be one of {sorted(CLASSES)}, got {model.hf_class!r}")
    model.hf_config = doc
    load_state(model, state, where)
    return model.eval()


def load_weights(directory: Path) -> dict[str, Any]:
    """The arrays of `model.safetensors`, or of every shard an index names."""
    from ._serialize import load_arrays

    single, index = directory / WEIGHTS, directory / WEIGHTS_INDEX
    if single.is_file():
        return load_arrays(single)
    if index.is_file():
        out: dict[str, Any] = {}
        for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            out.update(load_arrays(directory / shard))
        return out
    if (directory / "pytorch_model.bin").is_file():
        raise FileNotFoundError(
            f"{directory}: only pytorch_model.bin (a pickle, which is never loaded here); "
            "re-save it with save_pretrained(..., safe_serialization=True)"
        )
    raise FileNotFoundError(f"{directory}: no {WEIGHTS} or {WEIGHTS_INDEX}")


def config_doc(model: Any) -> dict[str, Any]:
    """config.json for `model`: the one it was loaded with, its sizes brought up to date."""
    c = model.config
    doc = dict(getattr(model, "hf_config", None) or {})
    doc.update(
        {
            "model_type": "gpt2",
            "architectures": [model.hf_class],
            "n_layer": c.n_layer,
            "n_head": c.n_head,
            "n_embd": c.d_model,
            "vocab_size": c.vocab,
            "n_positions": c.context,
            "layer_norm_epsilon": c.eps,
            "activation_function": c.activation,
            "attn_pdrop": c.dropout,
            "resid_pdrop": c.dropout,
            "embd_pdrop": c.dropout,
            "n_inner": doc.get("n_inner"),
            "tie_word_embeddings": True,
        }
    )
    doc.setdefault("scale_attn_weights", True)
    doc.setdefault("dtype", "float32")
    return doc


def save_pretrained(model: Any, directory: str | Path) -> None:
    """Write `config.json` + `model.safetensors` that the model's Hugging Face class loads."""
    from ._gpt2 import gpt2_state
    from ._serialize import save_arrays

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    prefix = CLASSES[model.hf_class]
    state = {prefix + k: v for k, v in gpt2_state(model).items()}
    save_arrays(state, directory / WEIGHTS, {"format": "pt"})
    text = json.dumps(config_doc(model), indent=2, sort_keys=True) + "\n"
    (directory / CONFIG).write_text(text)
