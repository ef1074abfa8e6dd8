"""Which array module an array belongs to, for kernels shared by the NumPy and CuPy backends.

A leaf on its own so that every kernel module can ask without importing another kernel
module (the CUDA backend runs the NumPy kernels on CuPy arrays, cupy_kernels.py).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

Array = Any
"""A NumPy or a CuPy array, as the shared kernels take and return them (CuPy ships no type
information, so nothing narrower names both)."""


def array_module(a: Any) -> ModuleType:
    """The array module of ``a``: NumPy, or CuPy for CuPy arrays. For NumPy arrays this is
    always ``np``, so CPU behaviour is as written; CuPy is imported only for its arrays."""
    if type(a).__module__.startswith("cupy"):
        import cupy  # type: ignore[import-not-found]

        return cupy
    return np
