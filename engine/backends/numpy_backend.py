"""The embedded CPU backend: NumPy arrays and the kernels of numpy_kernels."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...protocol import dtypes
from ..backend_base import Backend
from .cpu_memory import keep_freed_memory
from .cpu_threads import threads
from .numpy_kernels import KERNELS, WRITES_INTO


class NumpyBackend(Backend):
    """Arrays are NumPy arrays; moving to and from the host is a no-op."""

    name = "cpu"
    kernels = KERNELS
    writes_into = WRITES_INTO
    array_type = np.ndarray

    def __init__(self) -> None:
        threads()  # BLAS and the engine's own pool: one thread count, set once (cpu_threads)
        keep_freed_memory()  # freed arrays are reused, not page-faulted in anew (cpu_memory)

    def optimize_plan(self, plan: Any) -> Any:
        """Batched weight-gradient chains become one GEMM each (numpy_plan)."""
        from .numpy_plan import optimize_plan

        return optimize_plan(plan)

    def from_numpy(self, array: np.ndarray) -> np.ndarray:
        return array

    def to_numpy(self, array: np.ndarray) -> np.ndarray:
        return np.asarray(array)

    def scalar(self, value: Any, dtype: str) -> np.ndarray:
        return np.asarray(value, dtype=dtypes.to_numpy(dtype))

    def conform(self, array: Any, dtype: np.dtype) -> np.ndarray:
        """Make a kernel result exactly the declared dtype (NumPy widens mixed operands)."""
        if type(array) is not np.ndarray:
            array = np.asarray(array)
        if array.dtype != dtype:
            array = array.astype(dtype)
        return array

    def synchronize(self) -> None:
        """Nothing to wait for: NumPy runs synchronously."""
