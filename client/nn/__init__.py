"""Neural-network modules; `functional` holds the stateless forms."""

from .. import functional
from . import init
from ._attention import (
    MLP,
    CausalSelfAttention,
    MultiHeadAttention,
    TransformerBlock,
    causal_mask,
    scaled_dot_product_attention,
)
from ._auto import AutoModelForCausalLM
from ._generate import GenerationMixin
from ._gpt import GPT, GPTConfig
from ._hf import HFConfigError
from ._init import seed
from ._kv_cache import (
    CacheSpec,
    CacheStep,
    KVCache,
    KVCacheDoesNotFit,
    LayerCache,
    cached_attention,
)
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
from ._llama import LlamaForCausalLM
from ._llm_config import DecoderConfig
from ._llm_io import CheckpointError
from ._module import Module, ModuleList, Sequential
from ._serialize import load_arrays as load_safetensors
from ._serialize import save_arrays as save_safetensors

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
