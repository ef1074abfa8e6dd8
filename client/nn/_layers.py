"""Layers: thin holders of parameters around `functional`."""

from __future__ import annotations

import math

from .. import functional as F
from .._device import Device
from .._tensor import Tensor
from . import _init
from ._module import Module


class Linear(Module):
    """y = x W^T + b with W of shape (out, in), initialised as PyTorch does."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, device: Device | None = None
    ) -> None:
        dev = device or Device.cpu()
        self.in_features, self.out_features = in_features, out_features
        self.weight = dev.tensor(
            _init.kaiming_uniform((out_features, in_features), in_features), requires_grad=True
        )
        if bias:
            self.bias = dev.tensor(
                _init.uniform((out_features,), 1 / math.sqrt(in_features)), requires_grad=True
            )
        else:
            self.bias = None

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)


class ReLU(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x)
