"""safetensors files from and to dicts of NumPy arrays: the one file format nn writes.

safetensors is a JSON header plus raw little-endian buffers, so loading runs no code (unlike
pickle) and the files open in PyTorch, JAX and the Hugging Face tools as they are.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file


def save_arrays(
    arrays: dict[str, np.ndarray], path: str | Path, metadata: dict[str, str] | None = None
) -> None:
    """Write contiguous copies (safetensors refuses views) with string-only metadata. Not
    ``np.ascontiguousarray``: it makes a 0-d array 1-d (a scalar would load back as (1,))."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {k: np.asarray(v, order="C") for k, v in arrays.items()}
    save_file(data, str(path), metadata={k: str(v) for k, v in (metadata or {}).items()})


def load_arrays(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file as a NumPy array, by name (no code runs)."""
    return load_file(str(path))


def load_metadata(path: str | Path) -> dict[str, str]:
    """The header's `__metadata__` (empty when the writer left none)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        return dict(f.metadata() or {})
