"""Neural-network modules; `functional` holds the stateless forms.

The layers and `Module` load with the package; the language-model half (GPT, Llama, the KV
cache, generation, checkpoints) on first use, through `__getattr__`: a script that builds
an MLP does not pay for it (bench/first_contact.py times script start to first loss)."""

from typing import TYPE_CHECKING

from .. import functional
from ..protocol.lazy import lazy_names
from . import init
from ._init import seed
from ._layers import (
    GELU,
    BatchNorm1d,
    BatchNorm2d,
    Conv2d,
    Dropout,
    Embedding,
    Flatten,
    LayerNorm,
    Linear,
    MaxPool2d,
    ReLU,
    RMSNorm,
)
from ._module import Module, ModuleList, Sequential

_LAZY = {
    # name: (module, attribute)
    **{
        name: ("._attention", name)
        for name in (
            "MLP",
            "CausalSelfAttention",
            "MultiHeadAttention",
            "TransformerBlock",
            "causal_mask",
            "scaled_dot_product_attention",
        )
    },
    **{
        name: ("._kv_cache", name)
        for name in (
            "CacheSpec",
            "CacheStep",
            "KVCache",
            "KVCacheDoesNotFit",
            "LayerCache",
            "cached_attention",
        )
    },
    "AutoModelForCausalLM": ("._auto", "AutoModelForCausalLM"),
    "GenerationMixin": ("._generate", "GenerationMixin"),
    "GPT": ("._gpt", "GPT"),
    "GPTConfig": ("._gpt", "GPTConfig"),
    "HFConfigError": ("._hf", "HFConfigError"),
    "LlamaForCausalLM": ("._llama", "LlamaForCausalLM"),
    "DecoderConfig": ("._llm_config", "DecoderConfig"),
    "CheckpointError": ("._llm_io", "CheckpointError"),
    "load_safetensors": ("._serialize", "load_arrays"),
    "save_safetensors": ("._serialize", "save_arrays"),
}
"""Public names loaded on first use (the language-model half and safetensors)."""


__getattr__, __dir__ = lazy_names(__name__, globals(), _LAZY)


if TYPE_CHECKING:  # for type checkers and IDEs: the names as if imported eagerly
    from ._attention import (  # noqa: F401
        MLP,
        CausalSelfAttention,
        MultiHeadAttention,
        TransformerBlock,
        causal_mask,
        scaled_dot_product_attention,
    )
    from ._auto import AutoModelForCausalLM  # noqa: F401
    from ._generate import GenerationMixin  # noqa: F401
    from ._gpt import GPT, GPTConfig  # noqa: F401
    from ._hf import HFConfigError  # noqa: F401
    from ._kv_cache import (  # noqa: F401
        CacheSpec,
        CacheStep,
        KVCache,
        KVCacheDoesNotFit,
        LayerCache,
        cached_attention,
    )
    from ._llama import LlamaForCausalLM  # noqa: F401
    from ._llm_config import DecoderConfig  # noqa: F401
    from ._llm_io import CheckpointError  # noqa: F401
    from ._serialize import load_arrays as load_safetensors  # noqa: F401
    from ._serialize import save_arrays as save_safetensors  # noqa: F401

__all__ = [
    "AutoModelForCausalLM",
    "CheckpointError",
    "DecoderConfig",
    "LlamaForCausalLM",
    "GELU",
    "BatchNorm1d",
    "BatchNorm2d",
    "CacheSpec",
    "CacheStep",
    "GPT",
    "MLP",
    "CausalSelfAttention",
    "Conv2d",
    "Dropout",
    "Embedding",
    "Flatten",
    "GPTConfig",
    "GenerationMixin",
    "HFConfigError",
    "KVCache",
    "KVCacheDoesNotFit",
    "LayerCache",
    "LayerNorm",
    "Linear",
    "MaxPool2d",
    "Module",
    "ModuleList",
    "MultiHeadAttention",
    "RMSNorm",
    "ReLU",
    "Sequential",
    "TransformerBlock",
    "cached_attention",
    "causal_mask",
    "functional",
    "init",
    "load_safetensors",
    "save_safetensors",
    "scaled_dot_product_attention",
    "seed",
]
