"""Llama-family checkpoints in transformers' directory layout, both ways, streamed.

Loading reads one tensor at a time (plain file reads, see `Checkpoint`) and hands it to the
device at once, so the client holds the model plus one tensor, never a second copy: on
`Device.cpu()` the peak stays near the file size, and a `RemoteDevice` gets the weights
while the client holds at most `STREAM_SYNC_BYTES` of them in flight. Before any weight is
read, the names and shapes in the file are checked against what the config implies:
missing, extra and misshapen tensors are refused, naming each.
"""

from __future__ import annotations

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
MAX_HEADER_BYTES = 100 << 20
"""The safetensors format's own bound on a header."""
_IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")
"""Old checkpoints stored RoPE's frequencies; transformers recomputes them, and so do we."""


class CheckpointError(ValueError):
    """The weights in a directory disagree with its config.json; names the tensors."""


class Checkpoint:
    """The tensors of a `save_pretrained` directory (one file or an index of shards), read
    one at a time; shapes and dtypes come from the headers without reading any data.

    Not `safetensors.safe_open`: it maps the whole file, and every page a read touches
    stays in this process's resident memory while the file is open, so the model's copy
    plus the mapping made the peak twice the file. Here each tensor is read with plain file
    I/O (`np.fromfile` at its offset, the layout of the safetensors format: an 8-byte
    little-endian header length, a JSON header of dtype, shape and data offsets, the data)
    into an array that goes to the device as it is.
    """

    def __init__(self, directory: Path) -> None:
        single, index = directory / WEIGHTS, directory / WEIGHTS_INDEX
        if single.is_file():
            files = [single]
            located = None
        elif index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            located = {k: directory / v for k, v in weight_map.items()}
            files = sorted(set(located.values()))
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
        self._entries: dict[str, tuple[Path, str, tuple[int, ...], int, int]] = {}
        for path in files:
            for key, entry in _read_header(path).items():
                if located is None or located.get(key) == path:
                    self._entries[key] = (path, *entry)
        if located is not None and located.keys() - self._entries.keys():
            lost = located.keys() - self._entries.keys()
            raise CheckpointError(f"{index}: the shards lack {_few(lost)}, which it names")
        self.nbytes = sum(p.stat().st_size for p in files)

    def names(self) -> set[str]:
        """The names of every tensor in the checkpoint (all shards), from the headers alone."""
        return set(self._entries)

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape of tensor ``name`` as stored (from the header; no data read). KeyError if absent."""
        return self._entries[name][2]

    def dtype(self, name: str) -> str:
        """Our dtype name of tensor ``name`` ("float32", "bfloat16", "float16"...). Raises
        CheckpointError for a dtype that is not a float (a checkpoint of integers is not weights)."""
        path, code = self._entries[name][:2]
        if code not in _SAFETENSORS_DTYPES:
            raise CheckpointError(f"{path}: {name} is stored as {code}, not a float dtype")
        return _SAFETENSORS_DTYPES[code]

    def read(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a NumPy array in its stored dtype and shape, read with plain file I/O
        (no mapping stays resident). Raises CheckpointError when its byte range does not match its
        shape and dtype, or the file ends inside it."""
        path, _, shape, start, end = self._entries[name]
        dtype = dtypes.to_numpy(self.dtype(name))
        count = int(np.prod(shape))
        if end - start != count * dtype.itemsize:
            raise CheckpointError(f"{path}: {name} holds {end - start} bytes, not {shape}")
        with open(path, "rb") as f:
            arr = np.fromfile(f, dtype=dtype.newbyteorder("<"), count=count, offset=start)
        if arr.size != count:
            raise CheckpointError(f"{path}: the file ends inside {name}")
        return arr.reshape(shape)


def _read_header(path: Path) -> dict[str, tuple[str, tuple[int, ...], int, int]]:
    """name -> (dtype code, shape, start, end), offsets from the file's start."""
    with open(path, "rb") as f:
        raw = f.read(8)
        size = int.from_bytes(raw, "little") if len(raw) == 8 else -1
        if not 0 < size <= MAX_HEADER_BYTES:
            raise CheckpointError(f"{path}: not a safetensors file (header length {size})")
        header = json.loads(f.read(size))
    base = 8 + size
    out = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        out[key] = (entry["dtype"], tuple(int(n) for n in entry["shape"]), base + begin, base + end)
    return out


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
        t = dev.tensor(arr, requires_grad=True, copy=False)
        del arr
        if pending >= STREAM_SYNC_BYTES:
            dev.sync()
            pending = 0
        return t

    model = LlamaForCausalLM(config, dev, target, source)
    dev.sync()
    model.hf_config = doc
    model.name_or_path = str(directory.resolve())
    return model


def from_config(doc: dict[str, Any], device: Device | None, dtype: str) -> Any:
    """A freshly initialised LlamaForCausalLM for a config.json document."""
    model = LlamaForCausalLM(decoder_config(doc), device, dtypes.normalize(dtype))
    model.hf_config = dict(doc)
    return model
