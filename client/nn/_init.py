"""Initialisation and dropout keys: reproducible from one seed, independent of device.

Weights are drawn on the host once (construction is not a hot path). Dropout keys come from a
counter: each dropout call in a step gets the next value as a `dev.scalar` binding, so the
step's graph keeps one hash while the dropped elements change every step.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

_rng = np.random.default_rng(0)
_keys = itertools.count(1)


def seed(value: int) -> None:
    """Reset the weight generator and the dropout key counter."""
    global _rng, _keys
    _rng = np.random.default_rng(value)
    _keys = itertools.count((value & 0xFFFF_FFFF) << 20 | 1)


def next_key(dev: Any) -> Any:
    """A fresh random key on `dev`, as a binding (its value is not part of the graph hash);
    a compiled step draws the next key on every replay, as the body would."""
    from .._bindings import binding

    return binding(dev, _draw, "int64")


def _draw() -> int:
    return next(_keys)


def kaiming_uniform(shape: tuple[int, ...], fan_in: int, a: float = math.sqrt(5)) -> np.ndarray:
    """PyTorch's default for Linear/Conv weights: U(-b, b), b = gain * sqrt(3 / fan_in)."""
    gain = math.sqrt(2.0 / (1 + a * a))
    bound = gain * math.sqrt(3.0 / max(fan_in, 1))
    return _rng.uniform(-bound, bound, size=shape).astype(np.float32)


def uniform(shape: tuple[int, ...], bound: float) -> np.ndarray:
    return _rng.uniform(-bound, bound, size=shape).astype(np.float32)


def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
    return (_rng.standard_normal(size=shape) * std).astype(np.float32)
