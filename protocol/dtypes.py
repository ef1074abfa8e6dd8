"""The dtypes both ends agree on: names on the wire, NumPy equivalents, promotion.

Names are the wire form (a graph hash covers them), so they never change spelling.
bfloat16 comes from ml_dtypes, which NumPy treats as an ordinary extension dtype; it is
imported the first time a bfloat16 is asked for (it costs a few ms of every import).
"""

from __future__ import annotations

from typing import Any

import numpy as np

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
INT_DTYPES = ("int8", "uint8", "int32", "int64")
DTYPES = ("bool", *INT_DTYPES, *FLOAT_DTYPES)

DEFAULT_FLOAT = "float32"
DEFAULT_INT = "int64"
INDEX_DTYPE = "int64"


class _NumpyDtypes(dict[str, np.dtype[Any]]):
    """name -> NumPy dtype; bfloat16 is added (ml_dtypes imported) on first lookup."""

    def __missing__(self, name: str) -> np.dtype:
        if name != "bfloat16":
            raise KeyError(name)
        import ml_dtypes

        dt = self["bfloat16"] = np.dtype(ml_dtypes.bfloat16)
        _FROM_NUMPY[dt] = "bfloat16"
        return dt


_NUMPY = _NumpyDtypes({name: np.dtype(name) for name in DTYPES if name != "bfloat16"})
_FROM_NUMPY = {v: k for k, v in _NUMPY.items()}

# Rank for promotion: kind first (bool < int < float), then width.
_KIND = {"bool": 0, **dict.fromkeys(INT_DTYPES, 1), **dict.fromkeys(FLOAT_DTYPES, 2)}


def to_numpy(name: str) -> np.dtype:
    """The NumPy dtype for a wire dtype name."""
    try:
        return _NUMPY[name]
    except KeyError:
        raise TypeError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPES)}") from None


def from_numpy(dtype: np.dtype | type) -> str:
    """The wire name of a NumPy dtype; float64 data stays float64, other kinds must be listed."""
    if isinstance(dtype, np.dtype):  # the common case first: ``dt.name`` is slow in NumPy
        name = _FROM_NUMPY.get(dtype)
        if name is not None:
            return name
    dt = np.dtype(dtype)
    if dt.name == "bfloat16" and "bfloat16" not in _NUMPY:
        to_numpy("bfloat16")  # an ml_dtypes array: ml_dtypes is loaded already, register it
    try:
        return _FROM_NUMPY[dt]
    except KeyError:
        raise TypeError(f"dtype {dt} is not supported; use one of {', '.join(DTYPES)}") from None


def normalize(dtype: object) -> str:
    """Accept a wire name, a NumPy dtype or a Python type and return the wire name."""
    if isinstance(dtype, str) and dtype in _KIND:
        return dtype
    if dtype is float:
        return DEFAULT_FLOAT
    if dtype is int:
        return DEFAULT_INT
    if dtype is bool:
        return "bool"
    return from_numpy(dtype)  # type: ignore[arg-type]


def is_float(name: str) -> bool:
    return _KIND[name] == 2


def is_int(name: str) -> bool:
    return _KIND[name] == 1


def promote(a: str, b: str) -> str:
    """Result dtype of a binary op on two tensors.

    Within a kind (int, float) it follows NumPy, except where NumPy has no answer (bfloat16:
    with float16 it gives float32) and where NumPy would widen past the listed dtypes (int8
    with uint8 gives int32 here, not int16). Across kinds the higher kind's dtype wins
    whatever its width, as in PyTorch: int64 with float16 is float16 (NumPy says float64).
    """
    if a == b:
        return a
    ka, kb = _KIND[a], _KIND[b]
    if ka != kb:
        return a if ka > kb else b
    if {a, b} == {"float16", "bfloat16"}:
        return "float32"
    if "bfloat16" in (a, b):
        other = b if a == "bfloat16" else a
        return other if other in ("float32", "float64") else "bfloat16"
    res = from_numpy(np.result_type(_NUMPY[a], _NUMPY[b])) if ka != 1 else None
    if res is None:
        r = np.result_type(_NUMPY[a], _NUMPY[b])
        res = _FROM_NUMPY.get(r, "int32" if r.itemsize <= 4 else "int64")
    return res


def scalar_dtype(value: object, other: str) -> str:
    """Weak typing: a Python scalar adopts the tensor's dtype unless its kind is higher."""
    if isinstance(value, bool):
        return other
    if isinstance(value, int):
        return other if _KIND[other] >= 1 else DEFAULT_INT
    if isinstance(value, float):
        return other if _KIND[other] == 2 else DEFAULT_FLOAT
    raise TypeError(f"expected a Python scalar, got {type(value).__name__}")


def itemsize(name: str) -> int:
    return _NUMPY[name].itemsize
