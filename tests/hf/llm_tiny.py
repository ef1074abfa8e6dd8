"""Tiny Llama-family checkpoints made with transformers (random init), saved with
`save_pretrained`: the four shapes the loader must get right, nothing downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

VOCAB, CONTEXT = 64, 32
_SIZES = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}


def configs() -> dict:
    """name -> transformers config: GQA + tied, llama3 RoPE (+ biases, MQA, head_dim),
    Qwen2's q/k/v biases, Mistral's sliding window (narrower than the test sequences)."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    return {
        "llama": LlamaConfig(
            **_SIZES, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=CONTEXT, tie_word_embeddings=True,
        ),
        "llama3": LlamaConfig(
            **_SIZES, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
            max_position_embeddings=64, rope_parameters=dict(LLAMA3_ROPE),
            attention_bias=True, mlp_bias=True,
        ),
        "qwen2": Qwen2Config(
            **_SIZES, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=CONTEXT,
        ),
        "mistral": MistralConfig(
            **_SIZES, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=CONTEXT, sliding_window=5,
        ),
    }  # fmt: skip


def make_llm(directory: Path, name: str, seed: int = 0, dtype=None, **save_kwargs) -> Path:
    """Save model `name` (see `configs`), weights drawn wide enough that logits differ by
    more than rounding, norms and biases perturbed so a mix-up shows."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(configs()[name]).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.add_(torch.randn_like(p) * 0.1)
            else:
                p.normal_(0, 0.1 if "bias" not in pname else 0.05)
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(directory, **save_kwargs)
    return directory


def hf_model(directory: Path, **kwargs):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        directory, attn_implementation="eager", **kwargs
    ).eval()


def token_ids(batch: int = 2, length: int = 16, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, size=(batch, length)).astype(np.int64)


def edit_config(directory: Path, **changes) -> None:
    """Rewrite config.json fields (None deletes one)."""
    path = directory / "config.json"
    doc = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            doc.pop(key, None)
        else:
            doc[key] = value
    path.write_text(json.dumps(doc, indent=2))
