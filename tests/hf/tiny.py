"""A tiny GPT-2 made with transformers (random init), saved as a save_pretrained directory."""

from __future__ import annotations

from pathlib import Path

import numpy as np

VOCAB, CONTEXT = 60, 16


def make_gpt2(directory: Path, seed: int = 0, bare: bool = False, **overrides) -> Path:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model

    torch.manual_seed(seed)
    config = GPT2Config(
        n_layer=2,
        n_head=4,
        n_embd=32,
        vocab_size=VOCAB,
        n_positions=CONTEXT,
        bos_token_id=0,
        eos_token_id=0,
        **overrides,
    )
    model = (GPT2Model if bare else GPT2LMHeadModel)(config).eval()
    with torch.no_grad():  # LayerNorms start at (1, 0): perturb them so a mix-up shows
        for name, p in model.named_parameters():
            if ".ln_" in name or name.startswith(("ln_f", "transformer.ln_f")):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(directory)
    return directory


def token_ids(batch: int = 2, length: int = CONTEXT, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, size=(batch, length)).astype(np.int64)


def hf_logits(model, ids: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = model(torch.from_numpy(ids))
    hidden = out.logits if hasattr(out, "logits") else out.last_hidden_state
    return hidden.numpy()
