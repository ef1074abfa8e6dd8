"""Submit-time checks of a training spec against the files it names.

The schema (``_spec``) sees only the spec; some mistakes show only next to the model and the
data: a LoRA target that names no layer (``c_atn``, which would otherwise leave training to
the names that do match), a batch larger than the data set, ``epochs`` that need the data
set's size to become steps. Checked here, when the job is submitted, from the files'
headers and sizes, so the user hears at once rather than when the job runs, and nothing is
narrowed silently.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._spec import BOUNDS, SpecError

Resolve = Callable[[str, str], Any]
MAX_HEADER = 100 * 2**20
"""safetensors' own cap on the JSON header's bytes."""


def preflight(spec: dict[str, Any], resolve: Resolve) -> dict[str, Any]:
    """The spec with ``steps`` filled in from ``epochs``; raises SpecError naming every
    problem found against the model and the data (one line each)."""
    if spec["kind"] == "onnx_export":
        return spec
    problems: list[str] = []
    model = spec["model"]
    weights = resolve(model["weights"], "model.weights") if model["weights"] else None
    header = _header(weights) if weights is not None else None
    if spec["kind"] == "lora_finetune" and header is not None:
        problems += _target_problems(spec["lora"]["target_modules"], header)
    samples = _samples(spec, resolve, header)
    if samples is not None:
        count, one_pass, what = samples
        if spec["batch_size"] > count:
            problems.append(
                f"batch_size: {spec['batch_size']} samples a step, but data.path holds "
                f"{count} {what}; lower batch_size or give more data"
            )
        if spec["epochs"] is not None:
            per_epoch = math.ceil(one_pass / spec["batch_size"])
            steps = max(1, math.ceil(spec["epochs"] * per_epoch))
            if steps > BOUNDS["steps"]:
                problems.append(
                    f"epochs: {spec['epochs']} epochs are {steps} steps, over the limit"
                )
            spec = {**spec, "steps": steps}
    if spec["epochs"] is not None and spec["steps"] is None:
        problems.append("epochs: this job's data size is unknown here; give steps instead")
    if problems:
        raise SpecError("\n".join(problems))
    warmup = spec.get("schedule", {}).get("warmup_steps", 0)
    if warmup > spec["steps"]:
        raise SpecError(f"schedule.warmup_steps: {warmup} exceeds steps {spec['steps']}")
    return spec


def _header(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, from a safetensors header (no tensor data is read)."""
    try:
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            doc = json.loads(f.read(size)) if 0 < size <= MAX_HEADER else None
    except (OSError, ValueError) as exc:
        raise SpecError(f"model.weights: not a safetensors file: {exc}") from None
    if type(doc) is not dict:
        raise SpecError("model.weights: not a safetensors file (no JSON header)")
    return {k: tuple(v["shape"]) for k, v in doc.items() if k != "__metadata__"}


def _target_problems(targets: str | list[str], header: dict[str, tuple[int, ...]]) -> list[str]:
    """Each listed target that names no layer with a 2-D weight. A single string is a regex
    (as in PEFT) or ``all-linear``: the run checks it against the built model."""
    if isinstance(targets, str):
        return []
    layers = sorted(
        {k.removesuffix(".weight") for k, shape in header.items() if k.endswith(".weight")}
        - {k.removesuffix(".weight") for k, shape in header.items() if len(shape) != 2}
    )
    names = sorted({path.rsplit(".", 1)[-1] for path in layers})
    missing = [
        t for t in targets if not any(path == t or path.endswith(f".{t}") for path in layers)
    ]
    if not missing:
        return []
    shown = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "")
    return [
        f"lora.target_modules: {', '.join(repr(t) for t in missing)} names no layer of "
        f"model.weights (its layers: {shown}); nothing was narrowed, fix the name"
    ]


def _samples(
    spec: dict[str, Any], resolve: Resolve, header: dict[str, tuple[int, ...]] | None
) -> tuple[int, int, str] | None:
    """(samples a batch draws from, samples in one pass over the data (an epoch), what the
    samples are), or None when the run has to say (it names what is missing)."""
    data = resolve(spec["data"]["path"], "data.path")
    arrays = _data_shapes(Path(data))
    if spec["model"]["arch"] == "gpt":
        context = _context(spec, resolve, header)
        if context is None:
            return None
        if "tokens" in arrays:
            n = math.prod(arrays["tokens"])
        elif arrays:
            return None  # the run names what is missing
        else:
            n = _text_length(Path(data), spec["data"]["alphabet"])
        windows = n - context - 1
        if windows < 1:
            raise SpecError(f"data.path: {n} tokens, need more than context + 1 = {context + 1}")
        return windows, max(1, n // context), f"windows of {context + 1} tokens ({n} tokens)"
    if "x" in arrays and arrays["x"]:
        return arrays["x"][0], arrays["x"][0], "samples"
    return None


def _context(
    spec: dict[str, Any], resolve: Resolve, header: dict[str, tuple[int, ...]] | None
) -> int | None:
    model = spec["model"]
    if model["hf_config"]:
        doc = json.loads(Path(resolve(model["hf_config"], "model.hf_config")).read_text())
        return doc.get("n_positions") or doc.get("n_ctx")
    if header is not None:
        wpe = [shape for k, shape in header.items() if k.endswith("wpe.weight")]
        return wpe[0][0] if wpe else None
    return (model["config"] or {}).get("context", 32)


def _data_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Array name -> shape of an npz (headers only); {} for a text file."""
    import zipfile

    import numpy as np  # here: importing the jobs package stays stdlib-only

    with open(path, "rb") as f:
        if f.read(2) != b"PK":
            return {}
    from ._models import check_npz

    try:
        check_npz(path)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    shapes = {}
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            if info.filename.endswith(".npy"):
                with zf.open(info) as f:
                    version = np.lib.format.read_magic(f)
                    read = (
                        np.lib.format.read_array_header_1_0
                        if version == (1, 0)
                        else np.lib.format.read_array_header_2_0
                    )
                    shapes[info.filename.removesuffix(".npy")] = read(f)[0]
    return shapes


def _text_length(path: Path, alphabet: str | None) -> int:
    """Tokens of a text data set: bytes, or characters with an alphabet."""
    if alphabet is None:
        return path.stat().st_size
    return len(path.read_text(encoding="utf-8"))
