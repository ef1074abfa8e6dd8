"""Models, datasets and optimizers built from a validated spec, on the job's device.

Everything here is deterministic given the spec's seed: weights come from the job's inputs or
from ``nn.seed(seed)``, and batches from a NumPy generator whose state the checkpoint saves.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from burn_remote import Device, lora, nn, optim

_LAYERS = {
    "linear": nn.Linear,
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "conv2d": nn.Conv2d,
    "maxpool2d": nn.MaxPool2d,
    "flatten": nn.Flatten,
    "layernorm": nn.LayerNorm,
    "dropout": nn.Dropout,
}
_WITH_DEVICE = ("linear", "conv2d", "layernorm")


def build_model(
    spec: dict[str, Any], dev: Device, resolve: Any, work: Path | None = None
) -> nn.Module:
    """The spec's model with its weights (``resolve`` maps a reference to a local file;
    ``work``: the job's directory, where an uploaded model.base is assembled)."""
    m = spec["model"]
    if m["arch"] == "llm":
        if work is None:
            raise ValueError("model.base: this job kind does not take a model directory")
        return _build_llm(spec, dev, resolve, work)
    weights = resolve(m["weights"], "model.weights") if m["weights"] else None
    if m["arch"] == "gpt":
        from burn_remote.nn import _hf
        from burn_remote.nn._gpt2 import config_from_file

        model: nn.GPT
        if m["hf_config"]:  # every hyperparameter from the config.json
            assert weights is not None, "validate: model.hf_config comes with model.weights"
            doc = json.loads(resolve(m["hf_config"], "model.hf_config").read_text())
            state = nn.load_safetensors(weights)
            model = _hf.build(
                nn.GPT, doc, state, dev, None, "model.hf_config", dropout=m["dropout"]
            )
            model.name_or_path = m["name_or_path"]
            return model
        if weights is not None:
            config = config_from_file(weights, m["n_head"])
        else:
            config = nn.GPTConfig(**(m["config"] or {}))
        model = nn.GPT(dataclasses.replace(config, dropout=m["dropout"]), device=dev)
        if weights is not None:
            model.load_gpt2(weights)
        model.name_or_path = m["name_or_path"]
        return model
    layers = []
    for i, layer in enumerate(m["layers"]):
        kind, args = layer["type"], {k: v for k, v in layer.items() if k != "type"}
        if kind in _WITH_DEVICE:
            args["device"] = dev
        try:
            layers.append(_LAYERS[kind](**args))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"model.layers[{i}]: {exc}") from None
    net = nn.Sequential(*layers)
    if weights is not None:
        net.load(weights)
    return net


def base_directory(spec: dict[str, Any], resolve: Any, work: Path) -> Path:
    """The model.base directory: on the server (`server:<dir>`), or the uploaded files
    linked under their names into a directory of the job's own."""
    m = spec["model"]
    if m["base"]:
        return Path(resolve(m["base"], "model.base"))
    folder = work / "base"
    folder.mkdir(parents=True, exist_ok=True)
    for name, ref in m["base_files"].items():
        link = folder / name
        link.unlink(missing_ok=True)
        link.symlink_to(Path(resolve(ref, f"model.base_files.{name}")).resolve())
    return folder


def _build_llm(spec: dict[str, Any], dev: Device, resolve: Any, work: Path) -> nn.Module:
    """A Llama-family model from model.base, streamed onto the job's device."""
    m = spec["model"]
    directory = base_directory(spec, resolve, work)
    try:
        model = nn.AutoModelForCausalLM.from_pretrained(directory, device=dev, dtype=m["dtype"])
    except (ValueError, FileNotFoundError) as exc:
        raise ValueError(f"model.base: {exc}") from None
    if not isinstance(model, nn.LlamaForCausalLM):
        raise ValueError("model.base: a GPT-2 directory goes in model.weights, not model.base")
    if m["gradient_checkpointing"]:
        model.gradient_checkpointing_enable()
    model.name_or_path = m["name_or_path"] or str(directory)
    object.__setattr__(model, "base_dir", directory)
    return model


def attach_adapter(model: nn.Module, spec: dict[str, Any], resolve: Any, work: Path) -> None:
    """Load the spec's LoRA adapter (PEFT layout) into ``model`` (exports merge it)."""
    m = spec["model"]
    if not m["adapter"]:
        return
    folder = work / "adapter"
    folder.mkdir(parents=True, exist_ok=True)
    if m["adapter"].startswith("job:"):
        files = resolve(m["adapter"], "model.adapter")
        for name in (lora._adapter.WEIGHTS, lora._adapter.CONFIG):
            if name not in files:
                raise ValueError(f"model.adapter: {m['adapter']} has no {name} output")
            shutil.copyfile(files[name], folder / name)
    else:
        shutil.copyfile(resolve(m["adapter"], "model.adapter"), folder / lora._adapter.WEIGHTS)
        shutil.copyfile(
            resolve(m["adapter_config"], "model.adapter_config"), folder / lora._adapter.CONFIG
        )
    model.load_adapter(folder)


def lora_config(spec: dict[str, Any]) -> lora.LoraConfig:
    c = spec["lora"]
    return lora.LoraConfig(
        r=c["r"],
        alpha=c["alpha"],
        dropout=c["dropout"],
        target_modules=c["target_modules"],
        use_rslora=c["use_rslora"],
        quantize=c["quantize"],
        task_type=c["task_type"],
    )


def make_optimizer(model: nn.Module, spec: dict[str, Any]) -> optim.Optimizer:
    o, s = spec["optimizer"], spec["schedule"]
    schedule = None
    if s["kind"] == "cosine":
        schedule = optim.cosine(spec["steps"], s["warmup_steps"], s["min_ratio"])
    elif s["kind"] == "linear_warmup":
        schedule = optim.linear_warmup(s["warmup_steps"])
    groups = [
        optim.ParamGroup(
            g["pattern"],
            name=g["name"],
            **{k: g[k] for k in ("lr", "weight_decay") if g[k] is not None},
        )
        for g in o["groups"]
    ]
    common = {"lr": o["lr"], "weight_decay": o["weight_decay"], "groups": groups}
    if o["name"] == "sgd":
        return optim.SGD(model, momentum=o["momentum"], schedule=schedule, **common)
    cls = optim.AdamW if o["name"] == "adamw" else optim.Adam
    return cls(model, betas=tuple(o["betas"]), eps=o["eps"], schedule=schedule, **common)


MAX_DATASET_BYTES = 4 * 2**30
"""Bytes a job's dataset may take once inflated (an npz is checked before it is)."""


def check_npz(path: Path, limit: int = MAX_DATASET_BYTES) -> None:
    """Refuse an npz whose arrays would inflate past ``limit``, from the sizes its zip
    directory and each array's header declare, before anything is decompressed (an array
    whose header claims more than its member holds is refused too).

    Raises:
        ValueError: naming the member and the sizes.
    """
    import zipfile

    total = 0
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                total += info.file_size
                if total > limit:
                    raise ValueError(
                        f"data.path: the npz inflates to more than {limit} bytes "
                        f"(at {info.filename!r}); the limit is MAX_DATASET_BYTES"
                    )
                if not info.filename.endswith(".npy"):
                    continue
                with zf.open(info) as f:
                    version = np.lib.format.read_magic(f)
                    read_header = (
                        np.lib.format.read_array_header_1_0
                        if version == (1, 0)
                        else np.lib.format.read_array_header_2_0
                    )
                    shape, _, dtype = read_header(f)
                nbytes = math.prod(shape) * dtype.itemsize
                if nbytes > info.file_size:
                    raise ValueError(
                        f"data.path: {info.filename!r} declares {nbytes} bytes of data but "
                        f"its member holds {info.file_size}"
                    )
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise ValueError(f"data.path: not a readable npz: {exc}") from None


class Dataset:
    """Token stream (GPT: random windows) or (x, y) arrays (sequential: random rows)."""

    def __init__(self, spec: dict[str, Any], path: Path, model: nn.Module) -> None:
        raw = path.read_bytes()
        self.tokens: np.ndarray | None = None
        self.rows: Any = None
        if isinstance(model, nn.LlamaForCausalLM):
            self.rows = _llm_rows(spec, raw, model)
            return
        if raw[:2] == b"PK":  # npz (a zip); pickled object arrays are refused
            check_npz(path)
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        else:
            arrays = {"tokens": _text_tokens(raw, spec["data"]["alphabet"])}
        if isinstance(model, nn.GPT):
            if "tokens" not in arrays:
                raise ValueError(
                    f"data.path: a GPT job needs a text file or an npz with "
                    f"'tokens'; got {sorted(arrays)}"
                )
            self.tokens = arrays["tokens"].astype(np.int64).reshape(-1)
            self.context = model.config.context
            vocab = model.config.vocab
            if self.tokens.size <= self.context + 1:
                raise ValueError(f"data.path: {self.tokens.size} tokens, need > context + 1")
            if self.tokens.min() < 0 or self.tokens.max() >= vocab:
                raise ValueError(f"data.path: token ids must be in [0, {vocab}) (the vocab)")
        else:
            if not {"x", "y"} <= arrays.keys():
                raise ValueError(
                    f"data.path: a sequential job needs an npz with 'x' and 'y'; "
                    f"got {sorted(arrays)}"
                )
            self.x = arrays["x"].astype(np.float32)
            self.y = arrays["y"]
            self.y = self.y.astype(np.int64 if self.y.dtype.kind in "iu" else np.float32)

    def sample(self, rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
        if self.rows is not None:
            idx = rng.integers(0, len(self.rows), size)
            return self.rows.inputs[idx], self.rows.targets[idx]
        if self.tokens is not None:
            starts = rng.integers(0, len(self.tokens) - self.context - 1, size)
            x = np.stack([self.tokens[s : s + self.context] for s in starts])
            y = np.stack([self.tokens[s + 1 : s + self.context + 1] for s in starts])
            return x, y
        idx = rng.integers(0, len(self.x), size)
        return self.x[idx], self.y[idx]


DEFAULT_SEQ_LEN = 512
"""data.seq_len when the spec gives none (or the model's context, if shorter)."""


def _llm_rows(spec: dict[str, Any], raw: bytes, model: Any) -> Any:
    """Rows of token ids and labels from text / JSONL / chat data, with the base's tokenizer."""
    from burn_remote import text_data
    from burn_remote.tokenizer import Tokenizer

    data = spec["data"]
    seq_len = data["seq_len"] or min(DEFAULT_SEQ_LEN, model.config.context)
    if seq_len > model.config.context:
        raise ValueError(
            f"data.seq_len: {seq_len} exceeds the model's max_position_embeddings "
            f"({model.config.context})"
        )
    try:
        tok = Tokenizer.from_pretrained(model.base_dir)
    except FileNotFoundError as exc:
        raise ValueError(f"model.base: {exc}") from None
    tok.check_vocab(model.config.vocab, "model.base")
    fmt, examples = text_data.read_records(raw, data["format"], "data.path")
    tokenized = text_data.tokenize(tok, fmt, examples, "data.path")
    pad = tok.token_id("pad_token")
    pad = pad if pad is not None else (tok.eos_token_id or 0)
    return text_data.make_rows(tokenized, seq_len, data["packing"], pad)


def _text_tokens(raw: bytes, alphabet: str | None) -> np.ndarray:
    if alphabet is None:
        return np.frombuffer(raw, dtype=np.uint8).astype(np.int64)
    index = {c: i for i, c in enumerate(alphabet)}
    text = raw.decode("utf-8")
    missing = sorted(set(text) - index.keys())
    if missing:
        raise ValueError(f"data.alphabet: lacks characters {missing[:10]!r} found in the text")
    return np.array([index[c] for c in text], dtype=np.int64)


def loss_of(model: nn.Module, dev: Device, x: np.ndarray, y: np.ndarray) -> Any:
    return loss_on(model, dev.tensor(x), dev.tensor(y))


def loss_on(model: nn.Module, x: Any, y: Any) -> Any:
    """The training loss of a batch already on the device (a compiled step takes tensors)."""
    from burn_remote import functional as F

    if isinstance(model, nn.GPT | nn.LlamaForCausalLM):
        return model.loss(x, y)
    out = model(x)
    if y.dtype == "int64":
        return F.cross_entropy(out, y)
    return ((out - y) ** 2).mean()


__all__ = [
    "Dataset",
    "attach_adapter",
    "base_directory",
    "build_model",
    "lora_config",
    "loss_of",
    "loss_on",
    "make_optimizer",
]
