"""Array helpers the NumPy kernels share, spelled for either array module (NumPy, or CuPy
through ``array_module``)."""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

from ...protocol import dtypes
from .array_module import Array
from .array_module import array_module as _mod


def contig(a: Array, dtype: np.dtype[Any] | None = None) -> Array:
    """``a`` as a C-contiguous array of ``dtype`` (no copy when it already is one)."""
    return _mod(a).ascontiguousarray(a, dtype=dtype)


SCATTER_ADD_DTYPES = frozenset({"int32", "int64", "float16", "float32", "float64"})
"""Dtypes `cupyx.scatter_add` accumulates natively (CUDA atomicAdd); the others (int8, uint8,
bool, bfloat16) accumulate in a wider dtype and are cast back, which gives NumPy's `add.at`
result exactly (integers wrap the same way, bool is "any")."""

_SCATTER_WIDE = {"int8": "int32", "uint8": "int32", "bool": "int32", "bfloat16": "float32"}


def add_at(out: Any, index: Any, values: Any) -> None:
    """Unbuffered `out[index] += values` (duplicates accumulate), on either module."""
    m = _mod(out)
    if m is np:
        np.add.at(out, index, values)
        return
    import cupyx  # type: ignore[import-not-found]

    name = dtypes.from_numpy(out.dtype)
    if name in SCATTER_ADD_DTYPES:
        cupyx.scatter_add(out, index, m.asarray(values, dtype=out.dtype))
        return
    wide = dtypes.to_numpy(_SCATTER_WIDE[name])
    acc = out.astype(wide)
    cupyx.scatter_add(acc, index, m.asarray(values).astype(wide))
    out[...] = (acc != 0) if name == "bool" else acc.astype(out.dtype)


def open_grid(m: ModuleType, shape: Sequence[int]) -> list[Array]:
    """`indices(shape, sparse=True)` spelled for any array module (CuPy's `indices` has no
    `sparse`): one arange per axis, shaped to broadcast against the others."""
    n = len(shape)
    return [m.arange(d).reshape((1,) * k + (d,) + (1,) * (n - k - 1)) for k, d in enumerate(shape)]
