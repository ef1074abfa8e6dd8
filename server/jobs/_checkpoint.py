"""Training checkpoints: everything a resumed job needs to continue bit for bit.

One safetensors file per checkpoint: the trainable parameters (``param/<name>``), the
optimizer's per-parameter state (``opt/<name>/<slot>``) and, in the string metadata, the step
and the data-sampling generator's state as JSON. Frozen base weights are not saved: the job
reloads them from its inputs. No pickle: the file is a JSON header and raw tensors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from ._store import write_atomic

FORMAT = "burn-remote-checkpoint/1"


def _named(opt: Any) -> list[tuple[str, Any]]:
    return [(n, p) for g in opt.groups for n, p in g.params if p.requires_grad]


def save_checkpoint(path: Path, opt: Any, step: int, rng: np.random.Generator) -> None:
    """Write atomically (temp file, fsync, rename): a crash leaves the previous checkpoint."""
    arrays: dict[str, np.ndarray] = {}
    for name, p in _named(opt):
        arrays[f"param/{name}"] = np.ascontiguousarray(p.numpy())
        for slot, t in opt.state.get(id(p), {}).items():
            arrays[f"opt/{name}/{slot}"] = np.ascontiguousarray(t.numpy())
    meta = {
        "format": FORMAT,
        "step": str(step),
        "optimizer_steps": str(opt.steps),
        "rng": json.dumps(rng.bit_generator.state),
    }
    write_atomic(path, st_save(arrays, metadata=meta))


def load_checkpoint(path: Path, opt: Any, rng: np.random.Generator) -> int:
    """Restore parameters, optimizer state and the generator; returns the step reached."""
    from safetensors import safe_open

    data = path.read_bytes()
    arrays = st_load(data)
    with safe_open(str(path), framework="numpy") as f:
        meta = dict(f.metadata() or {})
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path.name}: not a {FORMAT} file")
    for name, p in _named(opt):
        key = f"param/{name}"
        if key not in arrays:
            raise ValueError(f"{path.name}: lacks {key} (was the spec changed?)")
        dev = p.device
        p._assign(dev.tensor(arrays[key], dtype=p.dtype))
        slots = {k.rsplit("/", 1)[1]: v for k, v in arrays.items() if k.startswith(f"opt/{name}/")}
        if slots:
            opt.state[id(p)] = {s: dev.tensor(v) for s, v in slots.items()}
    opt.steps = int(meta["optimizer_steps"])
    rng.bit_generator.state = json.loads(meta["rng"])
    return int(meta["step"])


__all__ = ["load_checkpoint", "save_checkpoint"]
