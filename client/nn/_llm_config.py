"""config.json of a Llama-family checkpoint (llama, qwen2, mistral) -> `DecoderConfig`.

Every field that transformers' own classes read and that changes the numbers is either
honoured here or refused by name (`HFConfigError`): a field silently ignored would give
logits that differ from transformers' without an error. Fields transformers itself ignores
(ids of special tokens, `use_cache`, `initializer_range`, ...) are ignored here as well.

RoPE comes in two spellings in real files: `rope_theta` + `rope_scaling` (files written
before transformers 5) and `rope_parameters` (transformers 5, with `rope_theta` inside).
Both are read into one `RopeSpec`; the inverse frequencies are computed as transformers'
`modeling_rope_utils` computes them, in float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._hf import HFConfigError

MODEL_TYPES = ("llama", "qwen2", "mistral")
ROPE_TYPES = ("default", "linear", "llama3")
ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
}
"""config.json hidden_act -> the activation the MLP applies to its gate."""
CLASSES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
}
"""model_type -> the transformers class whose checkpoints and adapters we read and write."""
FULL, SLIDING = "full_attention", "sliding_attention"


@dataclass(frozen=True)
class RopeSpec:
    """Rotary embedding: the kind, its base and the knobs of the scaled kinds."""

    rope_type: str = "default"
    theta: float = 10000.0
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def inv_freq(self, head_dim: int) -> np.ndarray:
        """(head_dim / 2,) float32 inverse frequencies, as transformers computes them."""
        exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim
        inv = (1.0 / (np.float32(self.theta) ** exponents)).astype(np.float32)
        if self.rope_type == "linear":
            return (inv / np.float32(self.factor)).astype(np.float32)
        if self.rope_type == "llama3":
            return _llama3(inv, self)
        return inv


def _llama3(inv: np.ndarray, r: RopeSpec) -> np.ndarray:
    """Llama 3.1's frequency-dependent scaling: long wavelengths / factor, short ones kept,
    a smooth blend between."""
    old = r.original_max_position_embeddings
    low_wavelen, high_wavelen = old / r.low_freq_factor, old / r.high_freq_factor
    wavelen = (2 * math.pi / inv).astype(np.float32)
    scaled = np.where(wavelen > low_wavelen, inv / np.float32(r.factor), inv).astype(np.float32)
    smooth = (old / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor)
    blended = (1 - smooth) * scaled / np.float32(r.factor) + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, blended, scaled).astype(np.float32)


@dataclass(frozen=True)
class DecoderConfig:
    """What a Llama-family decoder's numbers depend on, read from config.json."""

    model_type: str
    vocab: int
    hidden: int
    intermediate: int
    n_layer: int
    n_head: int
    n_kv_head: int
    head_dim: int
    context: int
    eps: float
    activation: str
    rope: RopeSpec
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    sliding_windows: tuple[int | None, ...] = ()
    """Per layer: the window of a sliding-attention layer, None for full attention."""

    @property
    def hf_class(self) -> str:
        """The transformers class for ``model_type`` (e.g. "LlamaForCausalLM"): what checkpoints
        and PEFT adapters saved from this model are keyed for."""
        return CLASSES[self.model_type]


def _refuse(where: Any, field: str, value: Any, why: str) -> HFConfigError:
    return HFConfigError(f"{where}: {field}={value!r} is not supported ({why})")


def rope_spec(doc: dict[str, Any], where: Any) -> RopeSpec:
    """Both spellings: `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling`."""
    params = doc.get("rope_parameters")
    field = "rope_parameters"
    if params is None:
        params = dict(doc.get("rope_scaling") or {})
        field = "rope_scaling"
        params.setdefault("rope_theta", doc.get("rope_theta", 10000.0))
    elif "layer_types" in params or any(isinstance(v, dict) for v in params.values()):
        raise _refuse(where, "rope_parameters", params, "one RoPE for every layer")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise _refuse(where, f"{field}.rope_type", rope_type, f"supported: {list(ROPE_TYPES)}")
    partial = params.get("partial_rotary_factor", doc.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise _refuse(where, "partial_rotary_factor", partial, "RoPE over the whole head")
    for key in ("attention_factor", "beta_fast", "beta_slow", "short_factor", "long_factor"):
        if params.get(key) is not None:
            raise _refuse(where, f"{field}.{key}", params[key], f"not used by {rope_type} RoPE")
    spec = RopeSpec(rope_type=rope_type, theta=float(params["rope_theta"]))
    if rope_type == "linear":
        return RopeSpec(rope_type, spec.theta, factor=float(params["factor"]))
    if rope_type == "llama3":
        return RopeSpec(
            rope_type,
            spec.theta,
            factor=float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position_embeddings=int(params["original_max_position_embeddings"]),
        )
    return spec


def _layer_windows(doc: dict[str, Any], model_type: str, n_layer: int, where: Any) -> tuple:
    """Which layers attend through a sliding window, as transformers decides it per class."""
    window = doc.get("sliding_window")
    if model_type == "llama":
        return (None,) * n_layer
    if model_type == "mistral":
        return (None if window is None else int(window),) * n_layer
    # qwen2: the window only where use_sliding_window, from max_window_layers on
    if not doc.get("use_sliding_window", False):
        window = None
    types = doc.get("layer_types")
    if types is None:
        start = int(doc.get("max_window_layers", 28))
        types = [SLIDING if window is not None and i >= start else FULL for i in range(n_layer)]
    if len(types) != n_layer or not set(types) <= {FULL, SLIDING}:
        raise _refuse(where, "layer_types", types, f"{n_layer} of {FULL!r}/{SLIDING!r}")
    if SLIDING in types and window is None:
        raise _refuse(where, "layer_types", types, "sliding layers need a sliding_window")
    return tuple(None if window is None or t != SLIDING else int(window) for t in types)


def decoder_config(doc: dict[str, Any], where: Any = "config.json") -> DecoderConfig:
    """DecoderConfig from a llama / qwen2 / mistral config.json document."""
    model_type = doc.get("model_type")
    if model_type not in MODEL_TYPES:
        raise _refuse(where, "model_type", model_type, f"supported: {[*MODEL_TYPES, 'gpt2']}")
    if doc.get("quantization_config") is not None:
        raise _refuse(where, "quantization_config", "...", "load an unquantised checkpoint")
    act = doc.get("hidden_act", "silu")
    if act not in ACTIVATIONS:
        raise _refuse(where, "hidden_act", act, f"supported: {sorted(ACTIVATIONS)}")
    dropout = doc.get("attention_dropout", 0.0)
    if dropout:
        raise _refuse(where, "attention_dropout", dropout, "attention without dropout only")
    hidden, n_head = int(doc["hidden_size"]), int(doc["num_attention_heads"])
    n_kv = int(doc.get("num_key_value_heads") or n_head)
    if n_head % n_kv:
        raise _refuse(where, "num_key_value_heads", n_kv, f"must divide {n_head} heads")
    head_dim = int(doc.get("head_dim") or hidden // n_head)
    n_layer = int(doc["num_hidden_layers"])
    attention_bias = bool(doc.get("attention_bias", False)) if model_type == "llama" else False
    return DecoderConfig(
        model_type=model_type,
        vocab=int(doc["vocab_size"]),
        hidden=hidden,
        intermediate=int(doc["intermediate_size"]),
        n_layer=n_layer,
        n_head=n_head,
        n_kv_head=n_kv,
        head_dim=head_dim,
        context=int(doc.get("max_position_embeddings", 2048)),
        eps=float(doc.get("rms_norm_eps", 1e-6)),
        activation=ACTIVATIONS[act],
        rope=rope_spec(doc, where),
        qkv_bias=attention_bias or model_type == "qwen2",
        o_bias=attention_bias,
        mlp_bias=bool(doc.get("mlp_bias", False)) if model_type == "llama" else False,
        tie_word_embeddings=bool(doc.get("tie_word_embeddings", False)),
        sliding_windows=_layer_windows(doc, model_type, n_layer, where),
    )
