"""Job specs: a declarative schema and a validator whose errors name the key path.

A spec is a dict (or TOML text, parsed with tomllib) such as::

    kind = "lora_finetune"
    seed = 0
    steps = 100
    [model]
    weights = "sha256:<hex>"          # or "server:/allowed/dir/model.safetensors"
    hf_config = "sha256:<hex>"        # optional: the config.json of a save_pretrained dir
    name_or_path = "/home/me/gpt2"    # optional: what the adapter names as its base
    [data]
    path = "sha256:<hex>"
    [lora]
    r = 8
    target_modules = ["c_attn", "c_proj"]

A training job may name several servers by peer id, ``devices = ["<peer-id>", ...]``: it then
trains data-parallel on them (``burn_remote.DataParallel``), with this server as the
coordinator that holds the data and writes the one checkpoint. This server finds their
addresses itself (``serve --peer``, its address book, its relay: ``server/_peers.py``); an
address in the spec is refused, as a peer could otherwise make the server dial any host. A
server lost mid-way is dropped and the job goes on with the others (``_parallel.py``);
``require_all_devices = true`` fails the job instead.

Validation fills in defaults and refuses, with the dotted key path, anything else: wrong types
(``lora.r: expected a positive integer, got "8x"``), unknown keys (with the closest valid one)
and missing required keys. The validated spec is plain JSON data, stored as is in the job
store, so a job reruns from exactly what was accepted. Input references are strings:
``sha256:<hex>`` (an uploaded artifact), ``server:<path>`` (a file under a ``--job-path``
directory) or ``job:<id>`` (the outputs of an earlier job).
"""

from __future__ import annotations

import difflib
import json
import re
import tomllib
from collections.abc import Callable
from typing import Any

KINDS = ("lora_finetune", "onnx_export", "train")
REF_RE = re.compile(r"^(sha256:[0-9a-f]{64}|server:.+|job:[1-9][0-9]*)$")
LAYERS = ("linear", "relu", "gelu", "conv2d", "maxpool2d", "flatten", "layernorm", "dropout")


class SpecError(ValueError):
    """A spec did not validate; each line of the message starts with a key path."""


Check = Callable[[Any, str], Any]
_REQUIRED = object()


def _show(v: Any) -> str:
    try:
        text = json.dumps(v)
    except (TypeError, ValueError):
        text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _fail(path: str, what: str, v: Any) -> SpecError:
    return SpecError(f"{path}: expected {what}, got {_show(v)}")


MAX_SPEC_INT = 2**31 - 1
"""Largest integer any spec field takes (a bigger one is refused, not failed later)."""


def pos_int(v: Any, path: str) -> int:
    if type(v) is not int or v <= 0:
        raise _fail(path, "a positive integer", v)
    if v > MAX_SPEC_INT:
        raise _fail(path, f"a positive integer up to {MAX_SPEC_INT}", v)
    return v


def nonneg_int(v: Any, path: str) -> int:
    if type(v) is not int or v < 0:
        raise _fail(path, "a non-negative integer", v)
    if v > MAX_SPEC_INT:
        raise _fail(path, f"a non-negative integer up to {MAX_SPEC_INT}", v)
    return v


def upto(limit: int) -> Any:
    """A positive integer of at most ``limit`` (a field whose size the server allocates)."""

    def check(v: Any, path: str) -> int:
        pos_int(v, path)
        if v > limit:
            raise _fail(path, f"a positive integer up to {limit}", v)
        return v

    return check


BOUNDS = {
    "steps": 10_000_000,
    "batch_size": 65_536,
    "n_layer": 1024,
    "n_head": 1024,
    "d_model": 65_536,
    "vocab": 1_048_576,
    "context": 65_536,
    "r": 65_536,
}
"""Upper bounds of the spec fields that size what a job allocates (documented in the README's
Security model); the job's memory is also charged to the server's ledger as it runs."""


def number(v: Any, path: str) -> float:
    if type(v) not in (int, float):
        raise _fail(path, "a number", v)
    return float(v)


def pos_number(v: Any, path: str) -> float:
    if type(v) not in (int, float) or v <= 0:
        raise _fail(path, "a positive number", v)
    return float(v)


def fraction(v: Any, path: str) -> float:
    if type(v) not in (int, float) or not 0 <= v < 1:
        raise _fail(path, "a number in [0, 1)", v)
    return float(v)


def boolean(v: Any, path: str) -> bool:
    if type(v) is not bool:
        raise _fail(path, "true or false", v)
    return v


def string(v: Any, path: str) -> str:
    if type(v) is not str or not v:
        raise _fail(path, "a non-empty string", v)
    return v


def ref(v: Any, path: str) -> str:
    if type(v) is not str or not REF_RE.match(v):
        raise _fail(path, 'an input reference ("sha256:<hex>", "server:<path>" or "job:<id>")', v)
    return v


MAX_GRAD_ACCUM = 1024
"""Most micro-batches one optimizer step accumulates (each is recorded into the step)."""
MAX_JOB_DEVICES = 64
"""Most servers one data-parallel job may name (each is a session and a ring link)."""


def target(v: Any, path: str) -> str:
    """A server to dial, by peer id (what ``burn-remote id`` prints); never an address (the
    server resolves it itself). Checked here, so a typo is refused at submission."""
    from ...protocol.transport import PeerId

    if type(v) is not str or not v:
        raise _fail(path, 'a server as "PEER-ID"', v)
    if "@" in v:
        raise SpecError(
            f"{path}: name the server by its peer id only, without @HOST:PORT: this server "
            "dials only addresses it resolves itself (its serve --peer flags, its address "
            "book, its relay)"
        )
    try:
        PeerId.parse(v.strip())
    except ValueError as exc:
        raise SpecError(f"{path}: {exc}") from None
    return v.strip()


def one_of(*choices: Any) -> Check:
    def check(v: Any, path: str) -> Any:
        if v not in choices or type(v) is bool:
            raise _fail(path, "one of " + ", ".join(_show(c) for c in choices), v)
        return v

    return check


def list_of(item: Check, min_len: int = 0, max_len: int = 10_000) -> Check:
    def check(v: Any, path: str) -> list[Any]:
        if type(v) is not list or not min_len <= len(v) <= max_len:
            raise _fail(path, f"an array of {min_len}..{max_len} items", v)
        return [item(x, f"{path}[{i}]") for i, x in enumerate(v)]

    return check


def str_or_list(v: Any, path: str) -> str | list[str]:
    if type(v) is str and v:
        return v
    if type(v) is list and v and all(type(x) is str and x for x in v):
        return list(v)
    raise _fail(path, "a string or an array of strings", v)


def axis_names(v: Any, path: str) -> dict[str, str]:
    """Dynamic axes of the example: {"0" = "batch", "1" = "sequence"} (TOML keys are text)."""
    if type(v) is not dict or not v or len(v) > 8:
        raise _fail(path, 'a table of 1..8 axes such as {"0" = "batch", "1" = "sequence"}', v)
    for k, name in v.items():
        if not (type(k) is str and k.isdigit() and int(k) < 8):
            raise _fail(f"{path}.{k}", "an axis number 0..7 as the key", k)
        string(name, f"{path}.{k}")
    return dict(v)


def opt(check: Check) -> Check:
    """None (absent) allowed."""
    return lambda v, path: None if v is None else check(v, path)


def table(fields: dict[str, tuple[Check, Any]], aliases: dict[str, str] | None = None) -> Check:
    """A TOML table: each field is (check, default); default ``_REQUIRED`` means required.

    Every problem of the table (and of the tables inside it) is reported at once, one line
    each, so a spec is fixed in one edit rather than one submit per missing key. ``aliases``
    maps the spellings users bring from other tools (``learning_rate``) to the field's name
    (``lr``); the validated spec holds only the field's name."""

    def check(v: Any, path: str) -> dict[str, Any]:
        if type(v) is not dict:
            raise _fail(path or "spec", "a table", v)
        prefix = f"{path}." if path else ""
        v, problems = _unalias(v, aliases or {}, prefix)
        for key in v:
            if key not in fields:
                problems.append(_unknown(prefix + str(key), str(key), list(fields), aliases))
        out = {}
        for key, (fcheck, default) in fields.items():
            try:
                if key in v and v[key] is not None:
                    out[key] = fcheck(v[key], prefix + key)
                elif default is _REQUIRED:
                    problems.append(f"{prefix}{key}: required key is missing")
                else:
                    out[key] = default() if callable(default) else default
            except SpecError as exc:
                problems.extend(str(exc).splitlines())
        if problems:
            raise SpecError("\n".join(problems))
        return out

    return check


def _unalias(v: dict[str, Any], aliases: dict[str, str], prefix: str) -> tuple[dict, list[str]]:
    """``v`` with aliased keys renamed to their field; a key given both ways is a problem."""
    out, problems = dict(v), []
    for alias, field in aliases.items():
        if alias not in out:
            continue
        if field in out:
            problems.append(f"{prefix}{alias}: the same as {prefix}{field}; give only one")
            out.pop(alias)
        else:
            out[field] = out.pop(alias)
    return out, problems


def _unknown(path: str, key: str, valid: list[str], aliases: dict[str, str] | None = None) -> str:
    """The closest valid key (an alias shown as the key it stands for)."""
    aliases = aliases or {}
    close = difflib.get_close_matches(key, [*valid, *aliases], n=1, cutoff=0.4)
    if close:
        return f"{path}: unknown key; did you mean {aliases.get(close[0], close[0])!r}?"
    return f"{path}: unknown key; valid keys: {', '.join(sorted(valid))}"


# --- the schema -----------------------------------------------------------------------------
def _layer(v: Any, path: str) -> dict[str, Any]:
    if type(v) is not dict or "type" not in v:
        raise _fail(path, 'a table with a "type"', v)
    kind = one_of(*LAYERS)(v["type"], f"{path}.type")
    args = {k: x for k, x in v.items() if k != "type"}
    allowed = _LAYER_ARGS[kind]
    for k, x in args.items():
        if k not in allowed:
            raise SpecError(_unknown(f"{path}.{k}", k, list(allowed)))
        allowed[k](x, f"{path}.{k}")
    return {"type": kind, **args}


_LAYER_ARGS: dict[str, dict[str, Check]] = {
    "linear": {"in_features": pos_int, "out_features": pos_int, "bias": boolean},
    "conv2d": {
        "in_channels": pos_int,
        "out_channels": pos_int,
        "kernel_size": pos_int,
        "stride": pos_int,
        "padding": nonneg_int,
    },
    "maxpool2d": {"kernel_size": pos_int, "stride": pos_int},
    "flatten": {"start": nonneg_int},
    "layernorm": {"dim": pos_int},
    "dropout": {"p": fraction},
    "relu": {},
    "gelu": {},
}

GPT_CONFIG = table(
    {
        "n_layer": (upto(BOUNDS["n_layer"]), 2),
        "n_head": (upto(BOUNDS["n_head"]), 4),
        "d_model": (upto(BOUNDS["d_model"]), 64),
        "vocab": (upto(BOUNDS["vocab"]), 256),
        "context": (upto(BOUNDS["context"]), 32),
    }
)

BASE_FILE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MAX_BASE_FILES = 64
"""Files of one uploaded base directory (config, tokenizer, up to ~60 weight shards)."""


def base_files(v: Any, path: str) -> dict[str, str]:
    """An uploaded model directory: {file name = "sha256:<hex>"} (the client fills it in
    from a local `model.base` directory)."""
    if type(v) is not dict or not 0 < len(v) <= MAX_BASE_FILES:
        raise _fail(path, f"a table of 1..{MAX_BASE_FILES} files", v)
    for name, value in v.items():
        if type(name) is not str or not BASE_FILE_RE.match(name):
            raise _fail(f"{path}.{name}", "a plain file name", name)
        if type(value) is not str or not value.startswith("sha256:"):
            raise _fail(f"{path}.{name}", 'an uploaded file ("sha256:<hex>")', value)
        ref(value, f"{path}.{name}")
    return dict(v)


def server_dir(v: Any, path: str) -> str:
    if type(v) is not str or not v.startswith("server:") or len(v) <= len("server:"):
        raise _fail(
            path, 'a model directory on the server ("server:<dir>"; a local one is uploaded)', v
        )
    return v


MODEL = table(
    {
        "arch": (one_of("gpt", "sequential", "llm"), "gpt"),
        "base": (opt(server_dir), None),
        "base_files": (opt(base_files), None),
        "dtype": (opt(one_of("float32", "bfloat16", "float16")), None),
        "gradient_checkpointing": (boolean, False),
        "weights": (opt(ref), None),
        "hf_config": (opt(ref), None),
        "name_or_path": (opt(string), None),
        "n_head": (opt(pos_int), None),
        "dropout": (fraction, 0.0),
        "config": (opt(GPT_CONFIG), None),
        "layers": (opt(list_of(_layer, 1, 256)), None),
        "adapter": (opt(ref), None),
        "adapter_config": (opt(ref), None),
    }
)

DATA = table(
    {
        "path": (ref, _REQUIRED),
        "alphabet": (opt(string), None),
        "validation_split": (fraction, 0.0),
        "format": (one_of("auto", "text", "jsonl", "chat"), "auto"),
        "seq_len": (opt(upto(BOUNDS["context"])), None),
        "packing": (boolean, True),
    },
    aliases={"max_seq_length": "seq_len", "max_length": "seq_len"},
)

LORA = table(
    {
        "r": (upto(BOUNDS["r"]), 8),
        "alpha": (pos_number, 16.0),
        "dropout": (fraction, 0.0),
        "target_modules": (opt(str_or_list), None),  # default per arch (_cross_check)
        "use_rslora": (boolean, False),
        "quantize": (opt(one_of("nf4")), None),
        "task_type": (opt(string), None),
    },
    aliases={"rank": "r", "lora_alpha": "alpha", "lora_dropout": "dropout"},
)

GROUP = table(
    {
        "pattern": (str_or_list, _REQUIRED),
        "name": (opt(string), None),
        "lr": (opt(pos_number), None),
        "weight_decay": (opt(number), None),
    }
)

OPTIMIZER = table(
    {
        "name": (one_of("adamw", "adam", "sgd"), "adamw"),
        "lr": (pos_number, 1e-3),
        "weight_decay": (number, 0.0),
        "betas": (list_of(fraction, 2, 2), lambda: [0.9, 0.999]),
        "eps": (pos_number, 1e-8),
        "momentum": (fraction, 0.0),
        "groups": (list_of(GROUP, 0, 64), list),
    },
    aliases={"learning_rate": "lr", "type": "name"},
)

SCHEDULE = table(
    {
        "kind": (one_of("constant", "cosine", "linear_warmup"), "constant"),
        "warmup_steps": (nonneg_int, 0),
        "min_ratio": (fraction, 0.0),
    },
    aliases={"type": "kind", "warmup": "warmup_steps"},
)

_COMMON = {
    "kind": (one_of(*KINDS), _REQUIRED),
    "name": (opt(string), None),
    "seed": (nonneg_int, 0),
}
_TRAINING = {
    **_COMMON,
    "model": (MODEL, _REQUIRED),
    "data": (DATA, _REQUIRED),
    "steps": (upto(BOUNDS["steps"]), None),  # or `epochs`: one of the two (_cross_check)
    "epochs": (opt(pos_number), None),
    "batch_size": (upto(BOUNDS["batch_size"]), 8),
    "checkpoint_every": (pos_int, 10),
    "clip": (opt(pos_number), 1.0),
    "optimizer": (OPTIMIZER, lambda: OPTIMIZER({}, "optimizer")),
    "schedule": (SCHEDULE, lambda: SCHEDULE({}, "schedule")),
    "devices": (opt(list_of(target, 1, MAX_JOB_DEVICES)), None),
    "require_all_devices": (boolean, False),
    "grad_accum": (upto(MAX_GRAD_ACCUM), 1),
}
TRAINING_ALIASES = {
    "max_steps": "steps",
    "num_train_epochs": "epochs",
    "per_device_train_batch_size": "batch_size",
    "save_steps": "checkpoint_every",
    "max_grad_norm": "clip",
    "gradient_accumulation_steps": "grad_accum",
}
"""Top-level spellings of Hugging Face's TrainingArguments, taken as the spec's own keys."""

TOP_LEVEL_MOVES = {
    "learning_rate": ("optimizer", "lr"),
    "lr": ("optimizer", "lr"),
    "weight_decay": ("optimizer", "weight_decay"),
    "warmup_steps": ("schedule", "warmup_steps"),
    "lr_scheduler_type": ("schedule", "kind"),
}
"""Top-level keys users write for a field of a table (``learning_rate = 1e-4`` as in
TrainingArguments): taken as that field, unless the table gives it too."""

SCHEMAS: dict[str, Check] = {
    "lora_finetune": table(
        {**_TRAINING, "lora": (LORA, lambda: LORA({}, "lora")), "merge": (boolean, False)},
        aliases={**TRAINING_ALIASES, "save_merged": "merge"},
    ),
    "train": table(_TRAINING, aliases=TRAINING_ALIASES),
    "onnx_export": table(
        {
            **_COMMON,
            "model": (MODEL, _REQUIRED),
            "example_shape": (list_of(pos_int, 1, 8), _REQUIRED),
            "example_dtype": (opt(one_of("float32", "int64")), None),
            "dynamic_axes": (opt(axis_names), None),
            "opset": (opt(pos_int), None),
        }
    ),
}


def validate(spec: dict[str, Any] | str) -> dict[str, Any]:
    """The spec with defaults filled in; raises SpecError naming the first bad key path.

    Args:
        spec: a dict, or TOML text.
    """
    if isinstance(spec, str):
        try:
            spec = tomllib.loads(spec)
        except tomllib.TOMLDecodeError as exc:
            raise SpecError(f"spec: not valid TOML: {exc}") from None
    if type(spec) is not dict:
        raise _fail("spec", "a table", spec)
    kind = spec.get("kind")
    if kind is None:
        raise SpecError("kind: required key is missing")
    one_of(*KINDS)(kind, "kind")
    if kind != "onnx_export":
        spec = _move_top_level(spec)
    try:
        out = SCHEMAS[kind](spec, "")
    except SpecError as exc:
        lengths = (
            "steps",
            "epochs",
            *(a for a, f in TRAINING_ALIASES.items() if f in ("steps", "epochs")),
        )
        if kind != "onnx_export" and not any(k in spec for k in lengths):
            raise SpecError(f"{exc}\nsteps: required key is missing (or give epochs)") from None
        raise
    _cross_check(out)
    return out


def _move_top_level(spec: dict[str, Any]) -> dict[str, Any]:
    """``learning_rate = ...`` at the top becomes ``optimizer.lr`` (see TOP_LEVEL_MOVES)."""
    out = dict(spec)
    problems = []
    for key, (section, field) in TOP_LEVEL_MOVES.items():
        if key not in out:
            continue
        sub = out.get(section)
        if sub is not None and type(sub) is not dict:
            continue  # the table's own check names it
        sub = dict(sub or {})
        if field in sub:
            problems.append(f"{key}: the same as {section}.{field}; give only one")
        sub[field] = out.pop(key)
        out[section] = sub
    if problems:
        raise SpecError("\n".join(problems))
    return out


DEFAULT_TARGETS = {"gpt": ["c_attn", "c_proj", "c_fc"], "llm": ["q_proj", "v_proj"]}
"""lora.target_modules when the spec gives none: GPT-2's projections, or PEFT's default for
Llama-family models."""
_LLM_ONLY = (("model", "dtype"), ("model", "gradient_checkpointing"), ("data", "seq_len"))


def _check_llm(spec: dict[str, Any]) -> None:
    """A Llama-family base (model.base or model.base_files) and the keys only it takes."""
    model, data = spec["model"], spec.get("data") or {}
    if model["base"] and model["base_files"]:
        raise SpecError("model.base_files: give model.base or model.base_files, not both")
    has_base = bool(model["base"] or model["base_files"])
    if model["arch"] == "llm" and not has_base:
        raise SpecError('model.base: required when model.arch is "llm" (a model directory)')
    if has_base:
        for key in ("weights", "hf_config", "layers", "config", "n_head"):
            if model[key]:
                raise SpecError(f"model.{key}: not with model.base (the directory holds it)")
        model["arch"] = "llm"
        if spec.get("devices"):
            raise SpecError("devices: a job on a model.base runs on this server's device only")
    else:
        for section, key in _LLM_ONLY:
            table = spec.get(section) or {}
            if table.get(key) not in (None, False):
                raise SpecError(f"{section}.{key}: only for a model.base (a Llama-family dir)")
        if data.get("format") == "chat":
            raise SpecError('data.format: "chat" needs a model.base with a chat template')
    if spec.get("merge") and not has_base:
        raise SpecError("merge: only for a model.base (a Llama-family dir)")
    if "lora" in spec and spec["lora"]["target_modules"] is None:
        spec["lora"]["target_modules"] = list(DEFAULT_TARGETS.get(model["arch"], ["c_attn"]))
    if spec.get("grad_accum", 1) > 1 and spec.get("devices"):
        raise SpecError("grad_accum: not with devices (a data-parallel step is one batch)")


def _cross_check(spec: dict[str, Any]) -> None:
    """Rules that span keys."""
    model = spec["model"]
    _check_llm(spec)
    if model["arch"] == "sequential" and not model["layers"]:
        raise SpecError('model.layers: required when model.arch is "sequential"')
    if model["arch"] == "gpt" and model["layers"]:
        raise SpecError('model.layers: only for model.arch "sequential"')
    if (
        spec["kind"] in ("lora_finetune", "onnx_export")
        and model["weights"] is None
        and (model["arch"] != "llm")
    ):
        raise SpecError(f"model.weights: required key is missing (a {spec['kind']} job)")
    if model["hf_config"] and (model["arch"] != "gpt" or not model["weights"]):
        raise SpecError('model.hf_config: a GPT-2 config.json, with model.weights (arch "gpt")')
    if model["adapter_config"] and not model["adapter"]:
        raise SpecError("model.adapter_config: needs model.adapter")
    if model["adapter"] and not model["adapter"].startswith("job:") and not model["adapter_config"]:
        raise SpecError('model.adapter_config: required when model.adapter is not "job:<id>"')
    devices = spec.get("devices")
    if spec.get("require_all_devices") and not devices:
        raise SpecError("require_all_devices: only for a job that names devices")
    if devices:
        peers = [d.partition("@")[0].strip().lower() for d in devices]
        for k, peer in enumerate(peers):
            if peer in peers[:k]:
                raise SpecError(
                    f"devices[{k}]: the server {peer[:12]}... is also devices[{peers.index(peer)}]"
                    " (each replica needs a server of its own)"
                )
        if spec["batch_size"] < len(devices):
            raise SpecError(
                f"batch_size: {spec['batch_size']} samples cannot be split across "
                f"{len(devices)} devices (each replica needs at least one)"
            )
    if spec["kind"] != "onnx_export":
        if spec["steps"] is None and spec["epochs"] is None:
            raise SpecError("steps: required key is missing (or give epochs)")
        if spec["steps"] is not None and spec["epochs"] is not None:
            raise SpecError("epochs: give steps or epochs, not both")
    if "schedule" in spec and spec["steps"] is not None:
        sched = spec["schedule"]
        if sched["warmup_steps"] > spec["steps"]:
            raise SpecError(
                f"schedule.warmup_steps: {sched['warmup_steps']} exceeds steps {spec['steps']}"
            )


def refs(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """(key path, reference) of every input a validated spec names."""
    out = []
    model_keys = ("weights", "hf_config", "adapter", "adapter_config")
    for section, keys in (("model", model_keys), ("data", ("path",))):
        for key in keys:
            value = spec.get(section, {}).get(key)
            if value:
                out.append((f"{section}.{key}", value))
    model = spec.get("model", {})
    if model.get("base"):
        out.append(("model.base", model["base"]))
    for name, value in (model.get("base_files") or {}).items():
        out.append((f"model.base_files.{name}", value))
    return out


__all__ = ["KINDS", "MAX_JOB_DEVICES", "SpecError", "refs", "validate"]
