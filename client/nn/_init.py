"""Parameter initialisation on the host: reproducible from one seed, independent of device."""

from __future__ import annotations

import math

import numpy as np

_rng = np.random.default_rng(0)


def seed(value: int) -> None:
    """Reset the generator that module constructors draw initial weights from."""
    global _rng
    _rng = np.random.default_rng(value)


def kaiming_uniform(shape: tuple[int, ...], fan_in: int, a: float = math.sqrt(5)) -> np.ndarray:
    """PyTorch's default for Linear/Conv weights: U(-b, b), b = gain * sqrt(3 / fan_in)."""
    gain = math.sqrt(2.0 / (1 + a * a))
    bound = gain * math.sqrt(3.0 / max(fan_in, 1))
    return _rng.uniform(-bound, bound, size=shape).astype(np.float32)


def uniform(shape: tuple[int, ...], bound: float) -> np.ndarray:
    return _rng.uniform(-bound, bound, size=shape).astype(np.float32)


def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
    return (_rng.standard_normal(size=shape) * std).astype(np.float32)
