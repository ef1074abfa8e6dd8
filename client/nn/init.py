"""torch.nn.init: fill a tensor in place from the seeded default generator.

Values are drawn on the host (`burn_remote.manual_seed` / `nn.seed` reset the generator) and
replace the tensor's value; the tensor object stays the same, so a model's parameters and an
optimizer built on them keep working. Bounds and gains are torch's.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._tensor import Tensor
from . import _init


def _set(t: Tensor, values: np.ndarray) -> Tensor:
    t._assign(t.device.tensor(values.reshape(t.shape), dtype=t.dtype))
    return t


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The recommended scale for an activation (torch.nn.init.calculate_gain): tanh 5/3,
    relu sqrt(2), leaky_relu sqrt(2 / (1 + slope^2)), selu 3/4, linear and conv 1."""
    if nonlinearity in ("linear", "sigmoid", "identity") or nonlinearity.startswith("conv"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        return math.sqrt(2.0 / (1 + slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r}")


def _fans(t: Tensor) -> tuple[int, int]:
    if t.ndim < 2:
        raise ValueError("fan in and fan out need a tensor with at least 2 dimensions")
    receptive = int(np.prod(t.shape[2:])) if t.ndim > 2 else 1
    return t.shape[1] * receptive, t.shape[0] * receptive


def uniform_(t: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
    """Fill ``t`` in place with U(a, b) draws from the generator ``nn.seed`` sets."""
    return _set(t, _init._rng.uniform(a, b, size=t.shape))


def normal_(t: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """Fill ``t`` in place with N(mean, std^2) draws from the generator ``nn.seed`` sets."""
    return _set(t, _init._rng.normal(mean, std, size=t.shape))


def trunc_normal_(
    t: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0
) -> Tensor:
    """Normal draws redrawn until inside [a, b] (absolute bounds, as torch's)."""
    out = _init._rng.normal(mean, std, size=t.shape)
    bad = (out < a) | (out > b)
    while bad.any():
        out[bad] = _init._rng.normal(mean, std, size=int(bad.sum()))
        bad = (out < a) | (out > b)
    return _set(t, out)


def constant_(t: Tensor, val: float) -> Tensor:
    """Fill ``t`` in place with ``val``."""
    return _set(t, np.full(t.shape, val))


def zeros_(t: Tensor) -> Tensor:
    """Fill ``t`` in place with zeros."""
    return constant_(t, 0.0)


def ones_(t: Tensor) -> Tensor:
    """Fill ``t`` in place with ones."""
    return constant_(t, 1.0)


def eye_(t: Tensor) -> Tensor:
    """Fill a 2-d ``t`` in place with the identity (ones on the diagonal, zeros elsewhere)."""
    if t.ndim != 2:
        raise ValueError("eye_: only 2-d tensors")
    return _set(t, np.eye(t.shape[0], t.shape[1]))


def xavier_uniform_(t: Tensor, gain: float = 1.0) -> Tensor:
    """Glorot uniform: U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out)), in place."""
    fan_in, fan_out = _fans(t)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(t, -bound, bound)


def xavier_normal_(t: Tensor, gain: float = 1.0) -> Tensor:
    """Glorot normal: N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out)), in place."""
    fan_in, fan_out = _fans(t)
    return normal_(t, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)))


def _kaiming_std(t: Tensor, a: float, mode: str, nonlinearity: str) -> float:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = _fans(t)
    return calculate_gain(nonlinearity, a) / math.sqrt(fan_in if mode == "fan_in" else fan_out)


def kaiming_uniform_(
    t: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu"
) -> Tensor:
    """He uniform, as torch's: U(-b, b) with b = sqrt(3) * gain / sqrt(fan), in place."""
    bound = math.sqrt(3.0) * _kaiming_std(t, a, mode, nonlinearity)
    return uniform_(t, -bound, bound)


def kaiming_normal_(
    t: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu"
) -> Tensor:
    """He normal, as torch's: N(0, std^2) with std = gain / sqrt(fan), in place."""
    return normal_(t, 0.0, _kaiming_std(t, a, mode, nonlinearity))


__all__: list[Any] = [
    "calculate_gain",
    "constant_",
    "eye_",
    "kaiming_normal_",
    "kaiming_uniform_",
    "normal_",
    "ones_",
    "trunc_normal_",
    "uniform_",
    "xavier_normal_",
    "xavier_uniform_",
    "zeros_",
]
