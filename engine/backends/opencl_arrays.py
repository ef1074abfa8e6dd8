"""The OpenCL backend's arrays and strided views, apart from the backend that makes them.

A leaf: the backend and every OpenCL kernel module import these, so the kernel modules need
the backend class only for type hints.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ...protocol import dtypes
from . import cexpr


class CLArray:
    """A contiguous device array: buffer (None when empty), shape, NumPy dtype."""

    __slots__ = ("data", "shape", "dtype", "size", "name")

    def __init__(self, data: Any, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.data = data
        self.shape = tuple(shape)
        self.dtype = dtype
        self.size = math.prod(self.shape)
        self.name = dtypes.from_numpy(dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __repr__(self) -> str:
        return f"CLArray(shape={self.shape}, dtype={self.name})"


class View(NamedTuple):
    """A strided read (or write) of a CLArray, in elements."""

    array: CLArray
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


def view(a: CLArray) -> View:
    return View(a, a.shape, contiguous_strides(a.shape), 0)


TABLE_OPS = frozenset(cexpr.UNARY) | frozenset(cexpr.BINARY) | frozenset(cexpr.TERNARY)
"""Ops whose kernels come straight from the expression table."""
