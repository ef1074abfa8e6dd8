"""A GPT-2-style decoder: token + position embeddings, pre-norm blocks, tied LM head.

Module names follow GPT-2's checkpoint keys (`wte`, `wpe`, `h.0.attn.c_attn`, `ln_f`), so
state_dict keys, LoRA target names and PEFT adapter keys read the same as for the real model.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .. import functional as F
from .._device import Device
from .._tensor import Tensor
from . import _init
from ._attention import TransformerBlock
from ._layers import Dropout, Embedding, LayerNorm
from ._module import Module, ModuleList


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 64
    vocab: int = 256
    context: int = 64
    dropout: float = 0.0
    eps: float = 1e-5


class GPT(Module):
    """Decoder-only transformer; `forward(ids (B, T) int64) -> logits (B, T, vocab)`."""

    def __init__(self, config: GPTConfig, device: Device | None = None) -> None:
        dev = device or Device.cpu()
        c = config
        self.config = c
        self.wte = Embedding(c.vocab, c.d_model, std=0.02, device=dev)
        self.wpe = Embedding(c.context, c.d_model, std=0.01, device=dev)
        self.drop = Dropout(c.dropout)
        self.h = ModuleList(
            TransformerBlock(c.d_model, c.n_head, c.context, c.dropout, True, c.eps, device=dev)
            for _ in range(c.n_layer)
        )
        self.ln_f = LayerNorm(c.d_model, c.eps, device=dev)
        self.register_buffer("pos", dev.tensor(np.arange(c.context, dtype=np.int64)), False)
        self._init_weights()

    def _init_weights(self) -> None:
        """GPT-2's scheme: N(0, 0.02), zero biases, residual projections / sqrt(2 n_layer)."""
        resid_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, t in self.named_parameters(include_frozen=True):
            if name.startswith(("wte", "wpe")) or ".ln_" in name:
                continue
            if name.endswith(".bias"):
                arr = np.zeros(t.shape, np.float32)
            else:
                arr = _init.normal(t.shape, resid_std if name.endswith("c_proj.weight") else 0.02)
            t._assign(t.device.tensor(arr))

    def forward(self, ids: Tensor) -> Tensor:
        t = ids.shape[-1]
        if t > self.config.context:
            raise ValueError(f"GPT: {t} tokens exceed the context of {self.config.context}")
        pos = self.pos if t == self.config.context else self.pos[:t]
        x = self.drop(self.wte(ids) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        return x @ self.wte.weight.transpose(0, 1)

    def loss(self, ids: Tensor, targets: Tensor) -> Tensor:
        """Mean next-token cross-entropy; `targets` are `ids` shifted left by the caller."""
        logits = self(ids)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    # --- GPT-2 checkpoints ----------------------------------------------------------------
    def save_gpt2(self, path: str | Path) -> None:
        """Write GPT-2 `model.safetensors` keys and layouts (Conv1D weights as (in, out))."""
        from ._gpt2 import save_gpt2

        save_gpt2(self, path)

    def load_gpt2(self, path: str | Path) -> None:
        from ._gpt2 import load_gpt2

        load_gpt2(self, path)

    @classmethod
    def from_gpt2(
        cls, path: str | Path, n_head: int | None = None, device: Device | None = None
    ) -> GPT:
        """Build a model sized from the checkpoint's shapes, then load it."""
        from ._gpt2 import config_from_file

        model = cls(config_from_file(path, n_head), device)
        model.load_gpt2(path)
        return model

    def config_dict(self) -> dict[str, float | int]:
        return asdict(self.config)
