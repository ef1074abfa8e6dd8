"""A GPT-2-style decoder: token + position embeddings, pre-norm blocks, tied LM head.

Module names follow GPT-2's checkpoint keys (`wte`, `wpe`, `h.0.attn.c_attn`, `ln_f`), so
state_dict keys, LoRA target names and PEFT adapter keys read the same as for the real model.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

import numpy as np

from .. import functional as F
from .._device import Device
from .._tensor import Tensor
from . import _init
from ._attention import TransformerBlock
from ._generate import GenerationMixin
from ._gpt_config import GPTConfig
from ._kv_cache import CacheSpec, CacheStep
from ._layers import Dropout, Embedding, LayerNorm
from ._module import Module, ModuleList


class GPT(GenerationMixin, Module):
    """Decoder-only transformer; `forward(ids (B, T) int64) -> logits (B, T, vocab)`.

    `hf_class` is the Hugging Face class its checkpoints and adapters are keyed for
    (GPT2LMHeadModel, or the bare GPT2Model); `name_or_path` is what adapters record as
    `base_model_name_or_path` (the directory `from_pretrained` read).
    """

    hf_class: str = "GPT2LMHeadModel"
    name_or_path: str | None = None
    hf_config: dict | None = None
    pos: Tensor  # a buffer (register_buffer): the positions 0 .. context-1

    def __init__(self, config: GPTConfig, device: Device | None = None) -> None:
        from ._hf import ACTIVATIONS

        if config.activation not in ACTIVATIONS:
            raise ValueError(
                f"GPTConfig: activation {config.activation!r} is not one of {sorted(ACTIVATIONS)}"
            )
        dev = device or Device.cpu()
        c = config
        self.config = c
        self.wte = Embedding(c.vocab, c.d_model, std=0.02, device=dev)
        self.wpe = Embedding(c.context, c.d_model, std=0.01, device=dev)
        self.drop = Dropout(c.dropout)
        self.h = ModuleList(
            TransformerBlock(
                c.d_model,
                c.n_head,
                c.context,
                c.dropout,
                True,
                c.eps,
                device=dev,
                approximate=ACTIVATIONS[c.activation],
            )
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
        """``ids`` (B, T) int64 token ids to logits (B, T, vocab); the head is the token embedding
        transposed, as GPT-2's (weights tied).

        Raises ValueError when T exceeds ``config.context``."""
        t = ids.shape[-1]
        if t > self.config.context:
            raise ValueError(f"GPT: {t} tokens exceed the context of {self.config.context}")
        pos = self.pos if t == self.config.context else self.pos[:t]
        x = self.drop(self.wte(ids) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        return x @ self.wte.weight.transpose(0, 1)

    # --- generation (GenerationMixin) ----------------------------------------------------
    def cache_spec(self) -> CacheSpec:
        """The KV cache this model's generation needs: layers, heads, head size
        (``d_model // n_head``), the context and the embedding's dtype."""
        c = self.config
        return CacheSpec(
            c.n_layer, c.n_head, c.d_model // c.n_head, c.context, self.wte.weight.dtype
        )

    def forward_cached(self, ids: Tensor, step: CacheStep) -> Tensor:
        """Logits (B, vocab) of the last of `ids` (B, T), which go into the KV cache at
        `step`'s slots, embedded at `step.positions`."""
        x = self.drop(self.wte(ids) + self.wpe(step.positions))
        for i, block in enumerate(self.h):
            x = block(x, step.layer(i))
        x = self.ln_f(step.last(x))
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
        """Load a GPT-2 ``model.safetensors`` (Hugging Face keys, Conv1D weights stored (in, out))
        into this model, which must have the same sizes; LoRA adapters already attached are kept.

        Raises KeyError naming the weights the file lacks, ValueError for a shape that differs."""
        from ._gpt2 import load_gpt2

        load_gpt2(self, path)

    @classmethod
    def from_gpt2(
        cls, path: str | Path, n_head: int | None = None, device: Device | None = None
    ) -> GPT:
        """Build a model from a GPT-2 checkpoint file (or a `save_pretrained` directory).

        Hyperparameters come from the `config.json` beside the file, else from our own
        metadata, else from `n_head`; a file that tells none of them is refused rather than
        guessed (a wrong head count gives wrong logits without an error).
        """
        from ._gpt2 import config_from_file
        from ._hf import CONFIG

        path = Path(path)
        if path.is_dir():
            return cls.from_pretrained(path, device=device)
        if n_head is None and (path.parent / CONFIG).is_file():
            return cls.from_pretrained(path.parent, device=device, weights=path)
        model = cls(config_from_file(path, n_head), device)
        model.load_gpt2(path)
        return model

    @classmethod
    def from_pretrained(
        cls,
        directory: str | Path,
        device: Device | None = None,
        hf_class: str | None = None,
        weights: str | Path | None = None,
    ) -> GPT:
        """Load a Hugging Face GPT-2 directory (`save_pretrained`): every hyperparameter from
        its config.json, the weights from model.safetensors (or its shards). Like
        transformers, the model comes back in eval mode (dropout off); `train()` turns it on.

        Args:
            hf_class: the class adapters are keyed for; default the config's `architectures`.
            weights: a safetensors file to read instead of the directory's own.
        Raises:
            HFConfigError: the config asks for something this GPT does not implement.
        """
        from . import _hf
        from ._serialize import load_arrays

        directory = Path(directory)
        doc = _hf.read_config(directory)
        state = load_arrays(weights) if weights is not None else _hf.load_weights(directory)
        model = _hf.build(cls, doc, state, device, hf_class, directory / _hf.CONFIG)
        model.name_or_path = str(directory.resolve())
        return model

    def save_pretrained(self, directory: str | Path) -> None:
        """config.json + model.safetensors that `from_pretrained` here and the model's
        Hugging Face class (`hf_class`) both load; LoRA adapters are left out."""
        from ._hf import save_pretrained

        save_pretrained(self, directory)

    def config_dict(self) -> dict[str, float | int]:
        """The hyperparameters (`GPTConfig` as a dict): what `save_gpt2` records in the file's
        metadata, so `from_gpt2` can rebuild the model without a config.json."""
        return asdict(self.config)
