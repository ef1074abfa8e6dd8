"""Training checkpoints: everything a resumed job needs to continue bit for bit.

One safetensors file per checkpoint: the trainable parameters (``param/<name>``), the
optimizer's per-parameter state (``opt/<name>/<slot>``) and, in the string metadata, the step
and the data-sampling generator's state as JSON. Frozen base weights are not saved: the job
reloads them from its inputs. No pickle: the file is a JSON header and raw tensors.

Each checkpoint carries its checksum in its name, ``step-<step>.<sha256>.safetensors`` (the
sha256 of the whole file), and is verified before a job resumes from it: a file whose bytes
no longer match is skipped for the previous good one, and the job's events say so. The last
:data:`KEEP` checkpoints are kept, so there is one to fall back to.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from ._store import fsync_dir, write_atomic

FORMAT = "burn-remote-checkpoint/1"
KEEP = 2
"""Checkpoints kept per job: the newest, and one to fall back to if it is damaged."""
_NAME = re.compile(r"step-(\d{9})(?:\.([0-9a-f]{64}))?\.safetensors")


def seal(path: Path) -> Path:
    """Rename a freshly written ``step-N.safetensors`` to carry its sha256; returns the new
    path. A crash before this leaves an unsealed file, which is never resumed from."""
    sha = _sha256(path)
    sealed = path.with_name(f"{path.name.removesuffix('.safetensors')}.{sha}.safetensors")
    os.replace(path, sealed)
    fsync_dir(path.parent)
    return sealed


def prune(folder: Path, keep: int = KEEP) -> None:
    """Delete all but the newest ``keep`` sealed checkpoints (and any unsealed leftovers)."""
    found = sorted(_checkpoints(folder), reverse=True)
    for _, _, path in found[keep:] if keep else found:
        with contextlib.suppress(OSError):
            path.unlink()
    for path in folder.glob("step-*.safetensors"):
        m = _NAME.fullmatch(path.name)
        if m is not None and m.group(2) is None:
            with contextlib.suppress(OSError):
                path.unlink()


@dataclass(frozen=True)
class Choice:
    """The checkpoint to resume from, and what was skipped on the way."""

    path: Path | None
    """The newest checkpoint whose bytes match its checksum (None: start from step 0)."""
    skipped: tuple[str, ...]
    """One line per newer checkpoint that failed its checksum."""


def choose(folder: Path) -> Choice:
    """The newest verified checkpoint in ``folder``. A damaged one is renamed to
    ``<name>.damaged`` (kept for a look, never a candidate again)."""
    skipped: list[str] = []
    for step, sha, path in sorted(_checkpoints(folder), reverse=True):
        actual = _sha256(path)
        if actual == sha:
            return Choice(path, tuple(skipped))
        skipped.append(
            f"checkpoint at step {step} failed its checksum (sha256 {actual[:16]}..., "
            f"expected {sha[:16]}...): not resumed from; kept as {path.name}.damaged"
        )
        with contextlib.suppress(OSError):
            path.rename(path.with_name(path.name + ".damaged"))
    return Choice(None, tuple(skipped))


def _checkpoints(folder: Path) -> list[tuple[int, str, Path]]:
    out = []
    for path in folder.glob("step-*.safetensors") if folder.is_dir() else ():
        m = _NAME.fullmatch(path.name)
        if m is not None and m.group(2) is not None:
            out.append((int(m.group(1)), m.group(2), path))
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _named(opt: Any) -> list[tuple[str, Any]]:
    return [(n, p) for g in opt.groups for n, p in g.params if p.requires_grad]


def save_checkpoint(path: Path, opt: Any, step: int, rng: np.random.Generator) -> None:
    """Write atomically (temp file, fsync, rename): a crash leaves the previous checkpoint."""
    arrays: dict[str, np.ndarray] = {}
    for name, p in _named(opt):
        arrays[f"param/{name}"] = np.asarray(p.numpy(), order="C")
        for slot, t in opt.state.get(id(p), {}).items():
            arrays[f"opt/{name}/{slot}"] = np.asarray(t.numpy(), order="C")
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


__all__ = ["KEEP", "Choice", "choose", "load_checkpoint", "prune", "save_checkpoint", "seal"]
