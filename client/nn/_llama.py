"""Llama-family decoders (Llama, Qwen2, Mistral) with transformers' module names.

The tree is `model.embed_tokens`, `model.layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj,
post_attention_layernorm, mlp.{gate,up,down}_proj}`, `model.norm`, `lm_head`, exactly as
transformers' `LlamaForCausalLM` names it, so state_dict keys, checkpoints, PEFT
`target_modules` and adapter keys all read the same on both sides.

Numbers follow transformers' eager path: RMSNorm in float32 (then back to the stored
dtype), RoPE tables in float32 cast to the compute dtype, softmax in float32, grouped-query
attention by broadcasting each key/value head over its group of query heads (no copies).

Weights come from a `WeightSource` while the tree is built: a random one for a fresh model,
a checkpoint reader for `from_pretrained`, so a loaded model never holds a random
initialisation next to its real weights (the streaming load's memory bound depends on it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from burn_remote.protocol import dtypes

from .. import functional as F
from .._device import Device
from .._tensor import Tensor
from . import _init
from ._generate import GenerationMixin
from ._kv_cache import CacheSpec, CacheStep, LayerCache
from ._layers import Embedding, Linear
from ._llm_config import DecoderConfig
from ._module import Module, ModuleList
from ._recompute import checkpoint

WeightSource = Callable[[str, tuple[int, ...], str], Tensor]
"""(name, shape, kind) -> the tensor; kind is "weight", "bias", "norm" or "embedding"."""
INIT_STD = 0.02
"""transformers' default initializer_range, used for a fresh model's weights."""


def random_source(device: Device, dtype: str, std: float = INIT_STD) -> WeightSource:
    """Fresh weights as transformers initialises them: N(0, std), zero biases, unit norms."""

    numpy_dtype = dtypes.to_numpy(dtype)

    def make(name: str, shape: tuple[int, ...], kind: str) -> Tensor:
        if kind == "norm":
            arr = np.ones(shape, numpy_dtype)
        elif kind == "bias":
            arr = np.zeros(shape, numpy_dtype)
        else:
            arr = _init.normal(shape, std).astype(numpy_dtype)
        return device.tensor(arr, requires_grad=True)

    return make


def _linear(src: WeightSource, name: str, n_in: int, n_out: int, bias: bool) -> Linear:
    return Linear.from_tensors(
        src(f"{name}.weight", (n_out, n_in), "weight"),
        src(f"{name}.bias", (n_out,), "bias") if bias else None,
    )


class LlamaRMSNorm(Module):
    """x / rms(x) * weight, the normalisation in float32 whatever the stored dtype."""

    def __init__(self, weight: Tensor, eps: float) -> None:
        self.eps = eps
        self.weight = weight

    def extra_repr(self) -> str:
        """The weight's shape and ``eps``, as transformers prints them."""
        return f"{self.weight.shape}, eps={self.eps}"

    def forward(self, x: Tensor) -> Tensor:
        """``x`` (..., hidden) normalised by its root mean square in float32 and cast back to its
        dtype before the weight scales it (transformers' order, so bf16 numbers match)."""
        if x.dtype == "float32":
            return F.rms_norm(x, self.weight, self.eps)
        return F.rms_norm(x.cast("float32"), None, self.eps).cast(x.dtype) * self.weight


def rotary_tables(inv_freq: Tensor, positions: Tensor, dtype: str) -> tuple[Tensor, Tensor]:
    """cos and sin (T, head_dim) for `positions`, computed in float32, then `dtype`."""
    freqs = positions.cast("float32").unsqueeze(-1) * inv_freq
    emb = F.cat([freqs, freqs], axis=-1)
    return emb.cos().cast(dtype), emb.sin().cast(dtype)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x * cos + rotate_half(x) * sin over the last axis (halves swapped, first negated)."""
    half = x.shape[-1] // 2
    x1, x2 = F.split(x, half, axis=-1)
    return x * cos + F.cat([-x2, x1], axis=-1) * sin


def attention_mask(positions: Tensor, window: int | None) -> Tensor:
    """(T, T) bool, True where query i may see key j: j <= i, and i - j < window if any."""
    q, k = positions.unsqueeze(-1), positions.unsqueeze(0)
    keep = q >= k
    return keep if window is None else keep & ((q - k) < window)


class LlamaAttention(Module):
    """Causal self-attention with separate q/k/v/o projections, RoPE and key/value groups."""

    def __init__(self, c: DecoderConfig, src: WeightSource, prefix: str, window: int | None):
        self.n_head, self.n_kv_head, self.head_dim = c.n_head, c.n_kv_head, c.head_dim
        self.sliding_window = window
        q_out, kv_out = c.n_head * c.head_dim, c.n_kv_head * c.head_dim
        self.q_proj = _linear(src, f"{prefix}.q_proj", c.hidden, q_out, c.qkv_bias)
        self.k_proj = _linear(src, f"{prefix}.k_proj", c.hidden, kv_out, c.qkv_bias)
        self.v_proj = _linear(src, f"{prefix}.v_proj", c.hidden, kv_out, c.qkv_bias)
        self.o_proj = _linear(src, f"{prefix}.o_proj", q_out, c.hidden, c.o_bias)

    def extra_repr(self) -> str:
        """Query and key/value head counts, head size and the sliding window if any."""
        window = f", sliding_window={self.sliding_window}" if self.sliding_window else ""
        return f"heads={self.n_head}, kv_heads={self.n_kv_head}, head_dim={self.head_dim}{window}"

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        mask: Tensor | None,
        cache: LayerCache | None = None,
    ) -> Tensor:
        """`cache`: this layer's view of a generation step; keys and values then go into
        the KV cache and the step's mask replaces `mask`."""
        b, t, _ = x.shape
        groups = self.n_head // self.n_kv_head
        # (B, kv_heads, group, T, d): each key/value head broadcasts over its query heads,
        # head h using kv head h // group as transformers' repeat_kv does
        q = self.q_proj(x).reshape(b, t, self.n_kv_head, groups, self.head_dim)
        q = apply_rotary(q.transpose(1, 2).transpose(2, 3), cos, sin)
        k = self.k_proj(x).reshape(b, t, self.n_kv_head, 1, self.head_dim)
        k = apply_rotary(k.transpose(1, 2).transpose(2, 3), cos, sin)
        v = self.v_proj(x).reshape(b, t, self.n_kv_head, 1, self.head_dim)
        v = v.transpose(1, 2).transpose(2, 3)
        if cache is None:
            if mask is None:
                raise TypeError("LlamaAttention: mask is None: without a KV cache it is needed")
            y = self.attend(q, k, v, mask)  # (B, kv_heads, group, T, d)
        else:
            h, d = self.n_head, self.head_dim
            y = cache.attend(
                q.reshape(b, h, t, d), k.reshape(b, self.n_kv_head, t, d),
                v.reshape(b, self.n_kv_head, t, d), self.sliding_window,
            ).reshape(b, self.n_kv_head, groups, t, d)  # fmt: skip
        y = y.transpose(2, 3).transpose(1, 2).reshape(b, t, self.n_head * self.head_dim)
        return self.o_proj(y)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """softmax(q k^T / sqrt(d), masked) v, the softmax in float32 (transformers' eager).
        Keys and values arrive whole here; a key/value cache would extend them first."""
        scores = (q @ k.transpose(-1, -2)) * (self.head_dim**-0.5)
        scores = F.where(mask, scores, float("-inf"))
        if scores.dtype != "float32":
            return F.softmax(scores.cast("float32"), axis=-1).cast(q.dtype) @ v
        return F.softmax(scores, axis=-1) @ v


class LlamaMLP(Module):
    """down(act(gate(x)) * up(x)): SwiGLU with SiLU, or the configured activation."""

    def __init__(self, c: DecoderConfig, src: WeightSource, prefix: str) -> None:
        self.activation = c.activation
        self.gate_proj = _linear(src, f"{prefix}.gate_proj", c.hidden, c.intermediate, c.mlp_bias)
        self.up_proj = _linear(src, f"{prefix}.up_proj", c.hidden, c.intermediate, c.mlp_bias)
        self.down_proj = _linear(src, f"{prefix}.down_proj", c.intermediate, c.hidden, c.mlp_bias)

    def act(self, x: Tensor) -> Tensor:
        """The configured activation (``hidden_act``): SiLU for Llama, Qwen2 and Mistral; ReLU or
        GELU (exact, or tanh for "gelu_new" and "gelu_pytorch_tanh") for configs that name them."""
        if self.activation == "silu":
            return F.silu(x)
        if self.activation == "relu":
            return F.relu(x)
        return F.gelu(x, "tanh" if self.activation == "gelu_tanh" else "none")

    def forward(self, x: Tensor) -> Tensor:
        """``x`` (..., hidden) through down(act(gate(x)) * up(x)): (..., hidden) out."""
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(Module):
    """Pre-norm block: x + attn(norm(x)), then + mlp(norm(x))."""

    def __init__(self, c: DecoderConfig, src: WeightSource, prefix: str, i: int) -> None:
        def norm(name: str) -> LlamaRMSNorm:
            return LlamaRMSNorm(src(f"{prefix}.{name}.weight", (c.hidden,), "norm"), c.eps)

        self.input_layernorm = norm("input_layernorm")
        self.self_attn = LlamaAttention(c, src, f"{prefix}.self_attn", c.sliding_windows[i])
        self.post_attention_layernorm = norm("post_attention_layernorm")
        self.mlp = LlamaMLP(c, src, f"{prefix}.mlp")

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        mask: Tensor | None,
        cache: LayerCache | None = None,
    ) -> Tensor:
        """``x`` (B, T, hidden) through the pre-norm residual block, same shape out; ``cos``/``sin``
        are the rotary tables of its positions, ``mask`` the causal (or sliding) mask, ``cache`` a
        generation step's view of the KV cache (then ``mask`` is None)."""
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(Module):
    """Embeddings, the decoder layers and the final norm (transformers' `.model`)."""

    gradient_checkpointing = False
    inv_freq: Tensor  # buffers (register_buffer): RoPE's inverse frequencies (head_dim / 2,)
    positions: Tensor  # and the positions 0 .. context-1

    def __init__(self, c: DecoderConfig, src: WeightSource, device: Device) -> None:
        self.embed_tokens = Embedding.from_weight(
            src("model.embed_tokens.weight", (c.vocab, c.hidden), "embedding")
        )
        self.layers = ModuleList(
            LlamaDecoderLayer(c, src, f"model.layers.{i}", i) for i in range(c.n_layer)
        )
        self.norm = LlamaRMSNorm(src("model.norm.weight", (c.hidden,), "norm"), c.eps)
        inv_freq = c.rope.inv_freq(c.head_dim)
        self.register_buffer("inv_freq", device.tensor(inv_freq), persistent=False)
        positions = np.arange(c.context, dtype=np.int64)
        self.register_buffer("positions", device.tensor(positions), persistent=False)
        self.windows = sorted(set(c.sliding_windows), key=lambda w: w or 0)

    def forward(self, ids: Tensor) -> Tensor:
        """``ids`` (B, T) int64 to the final hidden states (B, T, hidden), after the last norm.
        Recomputes each layer in the backward when gradient checkpointing is on and training.
        Raises ValueError when T exceeds max_position_embeddings."""
        t = ids.shape[-1]
        if t > self.positions.shape[0]:
            raise ValueError(
                f"{t} tokens exceed max_position_embeddings ({self.positions.shape[0]})"
            )
        x = self.embed_tokens(ids)
        pos = self.positions if t == self.positions.shape[0] else self.positions[:t]
        cos, sin = rotary_tables(self.inv_freq, pos, x.dtype)
        masks = {w: attention_mask(pos, w) for w in self.windows}
        recompute = self.gradient_checkpointing and self.training
        for layer in self.layers:
            mask = masks[layer.self_attn.sliding_window]
            x = checkpoint(layer, x, cos, sin, mask) if recompute else layer(x, cos, sin, mask)
        return self.norm(x)


class LlamaForCausalLM(GenerationMixin, Module):
    """A Llama-family causal LM; `forward(ids (B, T) int64) -> logits (B, T, vocab)`.

    With `tie_word_embeddings` the head is the embedding matrix itself: it is one tensor
    (trained once, saved once), and `lm_head` holds no parameter of its own.
    """

    name_or_path: str | None = None
    hf_config: dict | None = None

    def __init__(
        self,
        config: DecoderConfig,
        device: Device | None = None,
        dtype: str = "float32",
        source: WeightSource | None = None,
    ) -> None:
        dev = device or Device.cpu()
        self.config = config
        self.hf_class = config.hf_class
        src = source or random_source(dev, dtype)
        self.model = LlamaModel(config, src, dev)
        self.lm_head: TiedHead | Linear
        if config.tie_word_embeddings:
            self.lm_head = TiedHead(self.model.embed_tokens)
        else:
            self.lm_head = _linear(src, "lm_head", config.hidden, config.vocab, False)
        self.eval()

    @property
    def dtype(self) -> str:
        """The dtype the weights are stored in ("float32", "bfloat16", ...), read from the embedding:
        what `from_pretrained(dtype=...)` loaded, and what a fresh KV cache is allocated in."""
        return self.model.embed_tokens.weight.dtype

    def forward(self, ids: Tensor) -> Tensor:
        """``ids`` (B, T) int64 token ids to logits (B, T, vocab) in the stored dtype.

        Raises ValueError when T exceeds the config's ``max_position_embeddings``."""
        return self.lm_head(self.model(ids))

    def gradient_checkpointing_enable(self) -> None:
        """While training, recompute each decoder layer in the backward instead of keeping
        its activations (transformers' name): less memory, one more forward per step."""
        self.model.gradient_checkpointing = True

    def gradient_checkpointing_disable(self) -> None:
        """Keep every decoder layer's activations for the backward again (the default: faster,
        more memory); transformers' name."""
        self.model.gradient_checkpointing = False

    @property
    def is_gradient_checkpointing(self) -> bool:
        """True while `gradient_checkpointing_enable` is in effect (transformers' name)."""
        return self.model.gradient_checkpointing

    # --- generation (GenerationMixin) ----------------------------------------------------
    def cache_spec(self) -> CacheSpec:
        """The KV cache this model's generation needs: layers, key/value heads (fewer than query
        heads under grouped-query attention), head size, the longest context and the dtype."""
        c = self.config
        return CacheSpec(c.n_layer, c.n_kv_head, c.head_dim, c.context, self.dtype)

    def forward_cached(self, ids: Tensor, step: CacheStep) -> Tensor:
        """Logits (B, vocab) of the last of `ids` (B, T), whose keys and values go into the
        KV cache at `step`'s slots, rotated at `step.positions`."""
        m, (b, t) = self.model, ids.shape
        x = m.embed_tokens(ids)
        cos, sin = rotary_tables(m.inv_freq, step.positions, x.dtype)  # (B, T, d)
        cos, sin = cos.reshape(b, 1, 1, t, -1), sin.reshape(b, 1, 1, t, -1)
        for i, layer in enumerate(m.layers):
            x = layer(x, cos, sin, None, step.layer(i))
        return self.lm_head(m.norm(step.last(x)))

    def loss(self, ids: Tensor, targets: Tensor, ignore_index: int = -100) -> Tensor:
        """Mean next-token cross-entropy in float32; `targets` are `ids` shifted left by the
        caller, `ignore_index` where no loss is wanted (prompts, padding)."""
        logits = self(ids)
        flat = logits.reshape(-1, logits.shape[-1]).cast("float32")
        return F.cross_entropy(flat, targets.reshape(-1), ignore_index=ignore_index)

    def state_dict(self) -> dict[str, np.ndarray]:
        """transformers' keys; a tied head appears as `lm_head.weight` too, as in torch."""
        out = super().state_dict()
        if self.config.tie_word_embeddings:
            out["lm_head.weight"] = out["model.embed_tokens.weight"]
        return out

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """`Module.load_state_dict` with transformers' keys; with tied embeddings an
        ``lm_head.weight`` entry (torch writes one) is skipped, as the head is the embedding."""
        if self.config.tie_word_embeddings:
            state = {k: v for k, v in state.items() if k != "lm_head.weight"}
        super().load_state_dict(state, strict)

    def save_pretrained(self, directory: Any) -> None:
        """config.json + model.safetensors that transformers' class loads (LoRA left out;
        merge first to keep it)."""
        from ._llm_save import save_pretrained

        save_pretrained(self, directory)


class TiedHead(Module):
    """The LM head of a tied model: logits = x E^T with E the embedding (not a child, so its
    weight is named once, as `model.embed_tokens.weight`)."""

    embedding: Embedding  # set past Module.__setattr__: not a child

    def __init__(self, embedding: Embedding) -> None:
        object.__setattr__(self, "embedding", embedding)

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``x @ E^T`` (..., vocab) from hidden states (..., hidden), E the token embedding."""
        return F.linear(x, self.embedding.weight)
