"""GPT's hyperparameters, apart from the model: the checkpoint readers (`_gpt2`, `_hf`) build
one from a file, and the model (`_gpt`) calls them, so the config is the leaf all three share.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPTConfig:
    """The sizes and choices of a GPT-2-style decoder (GPT-2's config.json in our names)."""

    n_layer: int = 2
    n_head: int = 4
    d_model: int = 64
    vocab: int = 256
    context: int = 64
    dropout: float = 0.0
    eps: float = 1e-5
    activation: str = "gelu_new"
    """config.json's activation_function: gelu_new / gelu_pytorch_tanh (tanh form) or gelu."""
