"""Layers: thin holders of parameters around `functional`."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import functional as F
from .._device import Device
from .._tensor import Tensor
from . import _init
from ._module import Module


def _pair(v: int | tuple[int, int]) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


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
        self.bias: Tensor | None = None
        if bias:
            self.bias = dev.tensor(
                _init.uniform((out_features,), 1 / math.sqrt(in_features)), requires_grad=True
            )

    @classmethod
    def from_tensors(cls, weight: Tensor, bias: Tensor | None = None) -> Linear:
        """A Linear around existing tensors (weight (out, in)), with no initialisation: a
        loaded checkpoint then never sits next to a random copy of itself in memory."""
        self = cls.__new__(cls)
        self.out_features, self.in_features = weight.shape
        self.weight, self.bias = weight, bias
        return self

    def extra_repr(self) -> str:
        """Sizes and whether a bias is held, as torch prints them, so a printed model reads the same."""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}"
        )

    def forward(self, x: Tensor) -> Tensor:
        """``x`` (..., in_features) to (..., out_features): any number of leading batch axes."""
        return F.linear(x, self.weight, self.bias)


class Embedding(Module):
    """A lookup table (num, dim); the backward scatters into the rows that were used."""

    def __init__(
        self, num_embeddings: int, dim: int, std: float = 1.0, device: Device | None = None
    ) -> None:
        dev = device or Device.cpu()
        self.num_embeddings, self.dim = num_embeddings, dim
        self.weight = dev.tensor(_init.normal((num_embeddings, dim), std), requires_grad=True)

    @classmethod
    def from_weight(cls, weight: Tensor) -> Embedding:
        """An Embedding around an existing (num, dim) table, with no initialisation."""
        self = cls.__new__(cls)
        self.num_embeddings, self.dim = weight.shape
        self.weight = weight
        return self

    def extra_repr(self) -> str:
        """``num_embeddings, dim`` as torch prints them."""
        return f"{self.num_embeddings}, {self.dim}"

    def forward(self, ids: Tensor) -> Tensor:
        """Integer ``ids`` of any shape to vectors of shape ``ids.shape + (dim,)``.

        An id >= ``num_embeddings`` fails (`OpFailed`, an IndexError on the device) when the
        result is computed, never a silent clamp; a negative id counts from the end, as in NumPy."""
        return F.embedding(ids, self.weight)


class LayerNorm(Module):
    """Normalise the last axis to zero mean, unit variance, then scale and shift."""

    def __init__(
        self, dim: int, eps: float = 1e-5, bias: bool = True, device: Device | None = None
    ) -> None:
        dev = device or Device.cpu()
        self.eps = eps
        self.weight = dev.tensor(np.ones(dim, np.float32), requires_grad=True)
        self.bias = dev.tensor(np.zeros(dim, np.float32), requires_grad=True) if bias else None

    def extra_repr(self) -> str:
        """The normalised shape and ``eps`` as torch prints them."""
        return f"({self.weight.shape[0]},), eps={self.eps}, elementwise_affine=True"

    def forward(self, x: Tensor) -> Tensor:
        """``x`` (..., dim) normalised over its last axis, same shape out."""
        return F.layer_norm(x, self.weight, self.bias, self.eps)


class RMSNorm(Module):
    """Scale by the root mean square of the last axis (no centring), as LLaMA does."""

    def __init__(self, dim: int, eps: float = 1e-6, device: Device | None = None) -> None:
        dev = device or Device.cpu()
        self.eps = eps
        self.weight = dev.tensor(np.ones(dim, np.float32), requires_grad=True)

    def forward(self, x: Tensor) -> Tensor:
        """``x`` (..., dim) divided by its root mean square over the last axis, times ``weight``."""
        return F.rms_norm(x, self.weight, self.eps)


class Dropout(Module):
    """Inverted dropout while training. Each call draws a fresh key binding (see `_init`), so
    the step graph is replayed with new masks instead of being registered again."""

    def __init__(self, p: float = 0.5) -> None:
        if not 0 <= p < 1:
            raise ValueError(f"Dropout: p must be in [0, 1), got {p}")
        self.p = p

    def extra_repr(self) -> str:
        """The drop probability as torch prints it."""
        return f"p={self.p}, inplace=False"

    def forward(self, x: Tensor) -> Tensor:
        """``x`` with each element zeroed with probability ``p`` and the rest scaled by 1 / (1 - p),
        so the expected value is unchanged; the identity in eval mode (``model.eval()``) or at p = 0."""
        if not self.training or self.p == 0:
            return x
        return F.dropout(x, self.p, _init.next_key(x.device))


class Conv2d(Module):
    """2-d convolution over NCHW input, weight (out, in / groups, kh, kw)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        groups: int = 1,
        bias: bool = True,
        device: Device | None = None,
    ) -> None:
        dev = device or Device.cpu()
        kh, kw = _pair(kernel_size)
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"Conv2d: channels {in_channels}->{out_channels} vs groups {groups}")
        fan_in = in_channels // groups * kh * kw
        self.stride, self.padding, self.dilation, self.groups = (
            _pair(stride),
            _pair(padding),
            _pair(dilation),
            groups,
        )
        self.weight = dev.tensor(
            _init.kaiming_uniform((out_channels, in_channels // groups, kh, kw), fan_in),
            requires_grad=True,
        )
        self.bias = (
            dev.tensor(_init.uniform((out_channels,), 1 / math.sqrt(fan_in)), requires_grad=True)
            if bias
            else None
        )

    def extra_repr(self) -> str:
        """Channels, kernel and stride, then only the settings that differ from torch's defaults."""
        out, per_group, kh, kw = self.weight.shape
        text = f"{per_group * self.groups}, {out}, kernel_size={(kh, kw)}, stride={self.stride}"
        if self.padding != (0, 0):
            text += f", padding={self.padding}"
        if self.dilation != (1, 1):
            text += f", dilation={self.dilation}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        return text + ("" if self.bias is not None else ", bias=False")

    def forward(self, x: Tensor) -> Tensor:
        """(N, in_channels, H, W) to (N, out_channels, H', W'), with H' and W' from the kernel,
        stride, padding and dilation as in torch."""
        return F.conv2d(
            x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups
        )


class MaxPool2d(Module):
    """Maximum over ``kernel_size`` windows of (N, C, H, W); ``stride`` defaults to the kernel
    (non-overlapping windows, as torch), ``padding`` pads with -inf so it never wins."""

    def __init__(
        self,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] | None = None,
        padding: int | tuple[int, int] = 0,
    ) -> None:
        self.kernel = _pair(kernel_size)
        self.stride = _pair(stride) if stride is not None else None
        self.padding = _pair(padding)

    def extra_repr(self) -> str:
        """Kernel, stride (the kernel when none was given) and padding, as torch prints them."""
        return f"kernel_size={self.kernel}, stride={self.stride or self.kernel}, padding={self.padding}"

    def forward(self, x: Tensor) -> Tensor:
        """(N, C, H, W) to (N, C, H', W'): the largest value of each window."""
        return F.max_pool2d(x, self.kernel, self.stride, self.padding)


class ReLU(Module):
    """max(x, 0) elementwise: a layer for `Sequential`, with no parameters."""

    def forward(self, x: Tensor) -> Tensor:
        """``x`` with its negative values set to 0, same shape out."""
        return F.relu(x)


class GELU(Module):
    """Gaussian error linear unit, with no parameters: exact (erf) by default, ``approximate="tanh"``
    for the form GPT-2 was trained with (its checkpoints match only that one)."""

    def __init__(self, approximate: str = "none") -> None:
        self.approximate = approximate

    def extra_repr(self) -> str:
        """Which form (``'none'`` or ``'tanh'``), as torch prints it."""
        return f"approximate={self.approximate!r}"

    def forward(self, x: Tensor) -> Tensor:
        """``x`` through GELU elementwise, same shape out."""
        return F.gelu(x, self.approximate)


class Flatten(Module):
    """Merge axes ``start`` to ``end`` (inclusive) into one, between a conv stack and a Linear;
    the default keeps the batch axis: (N, C, H, W) to (N, C*H*W)."""

    def __init__(self, start: int = 1, end: int = -1) -> None:
        self.start, self.end = start, end

    def extra_repr(self) -> str:
        """The merged axes, under torch's names ``start_dim`` and ``end_dim``."""
        return f"start_dim={self.start}, end_dim={self.end}"

    def forward(self, x: Tensor) -> Any:
        """``x`` with axes ``start`` .. ``end`` merged into one (a reshape: no copy is recorded)."""
        return x.flatten(self.start, self.end)


class _BatchNorm(Module):
    """torch's BatchNorm: batch statistics while training (running mean and unbiased
    variance updated in place with `momentum`), the running ones in eval mode."""

    expected_ndim: tuple[int, ...] = ()
    # buffers (register_buffer), present when track_running_stats
    running_mean: Tensor
    running_var: Tensor
    num_batches_tracked: Tensor

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device: Device | None = None,
    ) -> None:
        dev = device or Device.cpu()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        ones, zeros = np.ones(num_features, np.float32), np.zeros(num_features, np.float32)
        self.weight = dev.tensor(ones, requires_grad=True) if affine else None
        self.bias = dev.tensor(zeros, requires_grad=True) if affine else None
        if track_running_stats:
            self.register_buffer("running_mean", dev.tensor(zeros))
            self.register_buffer("running_var", dev.tensor(ones))
            self.register_buffer("num_batches_tracked", dev.tensor(np.array(0, np.int64)))

    def extra_repr(self) -> str:
        """Features, ``eps``, ``momentum`` and which statistics are kept, as torch prints them."""
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
            f"affine={self.affine}, bias={self.bias is not None}, "
            f"track_running_stats={self.track_running_stats}"
        )

    def forward(self, x: Tensor) -> Tensor:
        """``x`` normalised per channel (axis 1) and then scaled and shifted, same shape out.

        While training with running statistics it also counts the batch and updates
        ``running_mean`` and ``running_var`` in place. Raises ValueError for an input whose number
        of axes this class does not take (see `BatchNorm1d`, `BatchNorm2d`)."""
        if x.ndim not in self.expected_ndim:
            raise ValueError(
                f"{type(self).__name__}: expected {' or '.join(map(str, self.expected_ndim))}-d "
                f"input, got shape {x.shape}"
            )
        tracking = self.track_running_stats
        if self.training and tracking:
            from .._autograd import no_grad

            with no_grad():
                self.num_batches_tracked += 1
        return F.batch_norm(
            x,
            self.running_mean if tracking else None,
            self.running_var if tracking else None,
            self.weight,
            self.bias,
            self.training or not tracking,
            self.momentum,
            self.eps,
        )


class BatchNorm1d(_BatchNorm):
    """Batch normalisation over (N, C) or (N, C, L), per channel, as torch's BatchNorm1d (same
    arguments, same running statistics, so its state dicts load either way)."""

    expected_ndim = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch normalisation over (N, C, H, W), per channel, as torch's BatchNorm2d (same arguments,
    same running statistics, so its state dicts load either way)."""

    expected_ndim = (4,)
