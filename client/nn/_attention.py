"""Causal multi-head attention and the pre-norm transformer block GPT-2 uses.

The causal mask and anything else shape-only is uploaded once, at construction, as a
non-persistent buffer and sliced per call: a training step records only ops, never uploads,
so its graph replays unchanged.
"""

from __future__ import annotations

import math

import numpy as np

from .. import functional as F
from .._device import Device
from .._tensor import Tensor
from ._kv_cache import LayerCache
from ._layers import Dropout, LayerNorm, Linear
from ._module import Module


def causal_mask(context: int, device: Device | None = None) -> Tensor:
    """(context, context) bool, True where query i may attend to key j (j <= i)."""
    dev = device or Device.cpu()
    return dev.tensor(np.tril(np.ones((context, context), dtype=bool)))


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout: Dropout | None = None
) -> Tensor:
    """softmax(q k^T / sqrt(d) masked) v over (..., T, d); `mask` True keeps a score."""
    scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if mask is not None:
        scores = F.where(mask, scores, float("-inf"))
    weights = F.softmax(scores, axis=-1)
    if dropout is not None:
        weights = dropout(weights)
    return weights @ v


def _heads(x: Tensor, n_head: int) -> Tensor:
    b, t, c = x.shape
    return x.reshape(b, t, n_head, c // n_head).transpose(1, 2)


def _merge_heads(x: Tensor) -> Tensor:
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d)


class _CausalBase(Module):
    mask: Tensor  # a buffer (register_buffer): the (context, context) causal mask

    def _setup(self, d_model: int, n_head: int, context: int, dev: Device) -> None:
        if d_model % n_head:
            raise ValueError(f"attention: d_model {d_model} is not divisible by {n_head} heads")
        self.n_head, self.d_model, self.context = n_head, d_model, context
        self.register_buffer("mask", causal_mask(context, dev), persistent=False)

    def _mask(self, t: int) -> Tensor:
        if t > self.context:
            raise ValueError(f"attention: sequence of {t} exceeds the context of {self.context}")
        return self.mask if t == self.context else self.mask[:t, :t]


class CausalSelfAttention(_CausalBase):
    """GPT-2's attention: one fused projection `c_attn` (d -> 3d), then `c_proj` (d -> d)."""

    def __init__(
        self,
        d_model: int,
        n_head: int,
        context: int,
        dropout: float = 0.0,
        bias: bool = True,
        device: Device | None = None,
    ) -> None:
        dev = device or Device.cpu()
        self._setup(d_model, n_head, context, dev)
        self.c_attn = Linear(d_model, 3 * d_model, bias, device=dev)
        self.c_proj = Linear(d_model, d_model, bias, device=dev)
        self.attn_dropout = Dropout(dropout)
        self.resid_dropout = Dropout(dropout)

    def forward(self, x: Tensor, cache: LayerCache | None = None) -> Tensor:
        """`cache`: this layer's view of a generation step (KV cache written and read)."""
        q, k, v = F.split(self.c_attn(x), self.d_model, axis=-1)
        h = self.n_head
        q, k, v = _heads(q, h), _heads(k, h), _heads(v, h)
        if cache is not None:
            y = cache.attend(q, k, v)
        else:
            y = scaled_dot_product_attention(q, k, v, self._mask(x.shape[1]), self.attn_dropout)
        return self.resid_dropout(self.c_proj(_merge_heads(y)))


class MultiHeadAttention(_CausalBase):
    """Causal attention with separate q/k/v/o projections (the LLaMA/PEFT naming)."""

    def __init__(
        self,
        d_model: int,
        n_head: int,
        context: int,
        dropout: float = 0.0,
        bias: bool = False,
        device: Device | None = None,
    ) -> None:
        dev = device or Device.cpu()
        self._setup(d_model, n_head, context, dev)
        self.q_proj = Linear(d_model, d_model, bias, device=dev)
        self.k_proj = Linear(d_model, d_model, bias, device=dev)
        self.v_proj = Linear(d_model, d_model, bias, device=dev)
        self.o_proj = Linear(d_model, d_model, bias, device=dev)
        self.attn_dropout = Dropout(dropout)

    def forward(self, x: Tensor, cache: LayerCache | None = None) -> Tensor:
        """``x`` (B, T, d_model) to (B, T, d_model), each position attending to itself and the ones
        before it. With ``cache`` (a generation step), keys and values are written to and read from
        the KV cache instead of the causal mask; raises ValueError when T exceeds ``context``."""
        h = self.n_head
        q, k, v = (_heads(p(x), h) for p in (self.q_proj, self.k_proj, self.v_proj))
        if cache is not None:
            y = cache.attend(q, k, v)
        else:
            y = scaled_dot_product_attention(q, k, v, self._mask(x.shape[1]), self.attn_dropout)
        return self.o_proj(_merge_heads(y))


class MLP(Module):
    """d -> 4d -> GELU (tanh form, as GPT-2) -> d."""

    def __init__(
        self,
        d_model: int,
        dropout: float = 0.0,
        bias: bool = True,
        device: Device | None = None,
        approximate: str = "tanh",
    ) -> None:
        dev = device or Device.cpu()
        self.approximate = approximate
        self.c_fc = Linear(d_model, 4 * d_model, bias, device=dev)
        self.c_proj = Linear(4 * d_model, d_model, bias, device=dev)
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """``x`` (..., d_model) through c_fc (to 4 d_model), GELU, c_proj and dropout; same shape out."""
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), self.approximate)))


class TransformerBlock(Module):
    """Pre-norm residual block: x + attn(ln_1(x)), then + mlp(ln_2(x))."""

    def __init__(
        self,
        d_model: int,
        n_head: int,
        context: int,
        dropout: float = 0.0,
        bias: bool = True,
        eps: float = 1e-5,
        device: Device | None = None,
        approximate: str = "tanh",
    ) -> None:
        dev = device or Device.cpu()
        self.ln_1 = LayerNorm(d_model, eps, bias, device=dev)
        self.attn = CausalSelfAttention(d_model, n_head, context, dropout, bias, device=dev)
        self.ln_2 = LayerNorm(d_model, eps, bias, device=dev)
        self.mlp = MLP(d_model, dropout, bias, device=dev, approximate=approximate)

    def forward(self, x: Tensor, cache: LayerCache | None = None) -> Tensor:
        """``x`` (B, T, d_model) through the pre-norm residual block, same shape out; ``cache`` is
        passed to the attention during generation (see `CausalSelfAttention.forward`)."""
        x = x + self.attn(self.ln_1(x), cache)
        return x + self.mlp(self.ln_2(x))
