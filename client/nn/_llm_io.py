"""Llama-family checkpoints in transformers' directory layout, both ways, streamed.

Loading reads one tensor at a time (`safetensors.safe_open`) and hands it to the device at
once, so the client holds the model plus one tensor, never a second copy of the model: on
`Device.cpu()` the peak stays near the file size, and a `RemoteDevice` gets the weights
while the client holds at most `STREAM_SYNC_BYTES` of them in flight. Before any weight is
read, the names and shapes in the file are checked against what the config implies:
missing, extra and misshapen tensors are refused, naming each.
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
from burn_remote.protocol import dtypes

from .._device import Device
from .._tensor import Tensor
from ._hf import CONFIG, WEIGHTS, WEIGHTS_INDEX, read_config
from ._llama import LlamaForCausalLM
from ._llm_config import DecoderConfig, decoder_config

STREAM_SYNC_BYTES = 256 << 20
"""While loading, the device is synced after this many bytes of weights: a RemoteDevice's
uploads then never pile up in the client beyond it."""
FLOAT_STORAGE = ("float32", "float16", "bfloat16")
"""dtypes a checkpoint's weights may be stored in, and `dtype=` may ask for."""
_SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}
_IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")
"""Old checkpoints stored RoPE's frequencies; transformers recomputes them, and so do we."""


class CheckpointError(ValueError):
    """The weights in a directory disagree with its config.json; names the tensors."""


class Checkpoint:
    """The tensors of a `save_pretrained` directory (one file or an index of shards), read
    one at a time; shapes and dtypes come from the headers without reading any data."""

    def __init__(self, directory: Path) -> None:
        single, index = directory / WEIGHTS, directory / WEIGHTS_INDEX
        if single.is_file():
            files = {single}
            located = None
        elif index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            located = {k: directory / v for k, v in weight_map.items()}
            files = set(located.values())
            for path in files:
                if not path.is_file():
                    raise FileNotFoundError(f"{index} names {path.name}, which is missing")
        elif (directory / "pytorch_model.bin").is_file():
            raise FileNotFoundError(
                f"{directory}: only pytorch_model.bin (a pickle, which is never loaded here); "
                "re-save it with save_pretrained(..., safe_serialization=True)"
            )
        else:
            raise FileNotFoundError(f"{directory}: no {WEIGHTS} or {WEIGHTS_INDEX}")
        from safetensors import safe_open

        dtypes.to_numpy("bfloat16")  # registers ml_dtypes, so bf16 tensors read as NumPy
        self._stack = contextlib.ExitStack()
        self._handles: dict[str, Any] = {}
        for path in sorted(files):
            handle = self._stack.enter_context(safe_open(str(path), framework="numpy"))
            for key in handle.keys():  # noqa: SIM118 (a safe_open handle, not a dict)
                if located is not None and located.get(key) != path:
                    continue
                self._handles[key] = handle
        self.nbytes = sum(p.stat().st_size for p in files)

    def names(self) -> set[str]:
        return set(self._handles)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handles[name].get_slice(name).get_shape())

    def dtype(self, name: str) -> str:
        code = self._handles[name].get_slice(name).get_dtype()
        if code not in _SAFETENSORS_DTYPES:
            raise CheckpointError(f"{name} is stored as {code}, not a float dtype")
        return _SAFETENSORS_DTYPES[code]

    def read(self, name: str) -> np.ndarray:
        return self._handles[name].get_tensor(name)

    def close(self) -> None:
        self._stack.close()


def expected_tensors(c: DecoderConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor the config implies, in transformers' names."""
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab, c.hidden)}
    q_out, kv_out = c.n_head * c.head_dim, c.n_kv_head * c.head_dim
    for i in range(c.n_layer):
        p = f"model.layers.{i}"
        out[f"{p}.input_layernorm.weight"] = (c.hidden,)
        for proj, n_out, bias in (("q", q_out, c.qkv_bias), ("k", kv_out, c.qkv_bias),
                                  ("v", kv_out, c.qkv_bias)):  # fmt: skip
            out[f"{p}.self_attn.{proj}_proj.weight"] = (n_out, c.hidden)
            if bias:
                out[f"{p}.self_attn.{proj}_proj.bias"] = (n_out,)
        out[f"{p}.self_attn.o_proj.weight"] = (c.hidden, q_out)
        if c.o_bias:
            out[f"{p}.self_attn.o_proj.bias"] = (c.hidden,)
        out[f"{p}.post_attention_layernorm.weight"] = (c.hidden,)
        for proj, shape in (("gate", (c.intermediate, c.hidden)),
                            ("up", (c.intermediate, c.hidden)),
                            ("down", (c.hidden, c.intermediate))):  # fmt: skip
            out[f"{p}.mlp.{proj}_proj.weight"] = shape
            if c.mlp_bias:
                out[f"{p}.mlp.{proj}_proj.bias"] = (shape[0],)
    out["model.norm.weight"] = (c.hidden,)
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = (c.vocab, c.hidden)
    return out


def _few(names: set[str] | list[str], limit: int = 8) -> str:
    ordered = sorted(names)
    more = f" and {len(ordered) - limit} more" if len(ordered) > limit else ""
    return ", ".join(ordered[:limit]) + more


def check_tensors(ckpt: Checkpoint, c: DecoderConfig, where: Path) -> dict[str, tuple]:
    """Refuse a checkpoint whose tensors disagree with its config, before reading data."""
    expected = expected_tensors(c)
    have = ckpt.names()
    ignored = {n for n in have if _IGNORED.search(n)}
    if c.tie_word_embeddings:
        ignored.add("lm_head.weight")  # transformers ties it to the embedding regardless
    missing, extra = expected.keys() - have, have - expected.keys() - ignored
    if missing or extra:
        parts = [
            f"missing {_few(missing)}" if missing else "",
            f"unexpected {_few(extra)}" if extra else "",
        ]
        raise CheckpointError(
            f"{where}: the weights do not match config.json ({c.model_type}, "
            f"{c.n_layer} layers): {'; '.join(p for p in parts if p)}"
        )
    for name, shape in expected.items():
        stored = ckpt.shape(name)
        if stored != shape:
            raise CheckpointError(
                f"{where}: {name} has shape {stored}, but config.json implies {shape} "
                f"(hidden_size {c.hidden}, heads {c.n_head}/{c.n_kv_head} of {c.head_dim}, "
                f"intermediate_size {c.intermediate}, vocab_size {c.vocab})"
            )
    return expected


def storage_dtype(ckpt: Checkpoint, dtype: Any, where: Path) -> str:
    """`dtype=` if given, else the dtype the embedding is stored in."""
    name = dtypes.normalize(dtype) if dtype is not None else ckpt.dtype("model.embed_tokens.weight")
    if name not in FLOAT_STORAGE:
        raise ValueError(f"{where}: dtype {name!r} is not one of {list(FLOAT_STORAGE)}")
    return name


def load_pretrained(directory: str | Path, device: Device | None, dtype: Any) -> Any:
    """A LlamaForCausalLM from a transformers directory, streamed onto `device`."""
    directory = Path(directory)
    doc = read_config(directory)
    config = decoder_config(doc, directory / CONFIG)
    dev = device or Device.cpu()
    ckpt = Checkpoint(directory)
    try:
        expected = check_tensors(ckpt, config, directory)
        target = storage_dtype(ckpt, dtype, directory)
        numpy_target = dtypes.to_numpy(target)
        pending = 0

        def source(name: str, shape: tuple[int, ...], kind: str) -> Tensor:
            nonlocal pending
            if expected.get(name) != shape:  # the tree and expected_tensors disagree: a bug
                raise AssertionError(f"{name}: built as {shape}, expected {expected.get(name)}")
            arr = ckpt.read(name)
            if arr.dtype != numpy_target:
                arr = arr.astype(numpy_target)
            pending += arr.nbytes
            t = dev.tensor(arr, requires_grad=True)
            del arr
            if pending >= STREAM_SYNC_BYTES:
                dev.sync()
                pending = 0
            return t

        model = LlamaForCausalLM(config, dev, target, source)
        dev.sync()
    finally:
        ckpt.close()
    model.hf_config = doc
    model.name_or_path = str(directory.resolve())
    return model


def from_config(doc: dict[str, Any], device: Device | None, dtype: str) -> Any:
    """A freshly initialised LlamaForCausalLM for a config.json document."""
    model = LlamaForCausalLM(decoder_config(doc), device, dtypes.normalize(dtype))
    model.hf_config = dict(doc)
    return model
