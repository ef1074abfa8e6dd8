"""LoraLinear: a frozen Linear plus a trainable low-rank update B A, scaled.

y = x W^T + b + scaling * B(A(dropout(x))), A (r, in) Kaiming-uniform, B (out, r) zeros, so a
fresh adapter changes nothing. The base tensors keep their names (`<path>.weight`,
`<path>.bias`), so checkpoints of the base model still load; the adapter adds
`<path>.lora_A.weight` and `<path>.lora_B.weight`, PEFT's names. With QLoRA the base weight is
replaced by NF4 buffers (`<path>.weight_codes` ...) and dequantised inside the forward.
"""

from __future__ import annotations

import math

import numpy as np

from .. import functional as F
from .._autograd import no_grad
from .._tensor import Tensor
from ..nn import Dropout, Linear, Module, _init
from ._config import LoraConfig
from ._quant import NF4Weight, _itemsize


class LoraLinear(Module):
    """Wraps `base` (its tensors are reused and frozen); see the module docstring."""

    def __init__(self, base: Linear, config: LoraConfig) -> None:
        dev = base.weight.device
        self.in_features, self.out_features = base.in_features, base.out_features
        self.r, self.scaling = config.r, config.scaling
        self.merged = False
        self.nf4: NF4Weight | None = None
        self.base_dtype = base.weight.dtype
        base.weight.requires_grad_(False)
        if config.quantize == "nf4":
            self.nf4 = NF4Weight.quantize(base.weight)
            for key, t in self.nf4.tensors().items():
                self.register_buffer(f"weight_{key}", t)
        else:
            self.weight = base.weight
        if base.bias is not None:
            base.bias.requires_grad_(False)
        self.bias = base.bias
        self.lora_dropout = Dropout(config.dropout)
        self.lora_A = Linear(self.in_features, config.r, bias=False, device=dev)
        self.lora_A.weight._assign(
            dev.tensor(_init.kaiming_uniform((config.r, self.in_features), self.in_features))
        )
        self.lora_B = Linear(config.r, self.out_features, bias=False, device=dev)
        self.lora_B.weight._assign(dev.tensor(np.zeros((self.out_features, config.r), np.float32)))

    @property
    def quantized(self) -> bool:
        """True when the base weight is held as NF4 (QLoRA, ``LoraConfig(quantize="nf4")``): such a
        layer cannot `merge`, and its base costs ~4.13 bits per parameter instead of 32."""
        return self.nf4 is not None

    def dense_weight(self) -> Tensor:
        """The base weight as floats (dequantised under QLoRA, in the dtype the layer was
        stored in), without the adapter."""
        if self.nf4 is None:
            return self.weight
        return self.nf4.dequantize(self.base_dtype)

    def delta_weight(self) -> Tensor:
        """scaling * B @ A, the (out, in) update the adapter adds to W (in the adapter's
        float32, as PEFT keeps adapters of a bf16/fp16 base)."""
        return (self.lora_B.weight @ self.lora_A.weight) * self.scaling

    def forward(self, x: Tensor) -> Tensor:
        """``x`` (..., in_features) to (..., out_features): the frozen base plus the scaled low-rank
        update. The update runs in the adapter's dtype (float32) and is added there before casting
        back, as PEFT does for a bf16/fp16 base; once merged only the base matmul runs."""
        y = F.linear(x, self.dense_weight(), self.bias)
        if self.merged:
            return y
        a = self.lora_A.weight
        update = self.lora_B(self.lora_A(self.lora_dropout(x.cast(a.dtype)))) * self.scaling
        if update.dtype == y.dtype:
            return y + update
        return (y.cast(a.dtype) + update).cast(y.dtype)  # PEFT: added in float32, cast back

    def merge(self) -> None:
        """W += scaling B A, so inference runs one matmul; `unmerge` takes it back out."""
        if self.nf4 is not None:
            raise ValueError("merge: an NF4 base cannot absorb the adapter without requantising")
        if not self.merged:
            with no_grad():
                w = self.weight
                self.weight._assign((w.cast("float32") + self.delta_weight()).cast(w.dtype))
            self.merged = True

    def unmerge(self) -> None:
        """Subtract scaling B A from W again, undoing `merge` (so training can go on); a no-op when
        not merged. W comes back up to the rounding of its stored dtype."""
        if self.merged:
            with no_grad():
                w = self.weight
                self.weight._assign((w.cast("float32") - self.delta_weight()).cast(w.dtype))
            self.merged = False

    def merged_linear(self) -> Linear:
        """A plain Linear holding W + scaling B A (dequantised first under QLoRA), for
        `merge_and_unload`."""
        with no_grad():
            w = self.dense_weight()
            if not self.merged:
                w = (w.cast("float32") + self.delta_weight()).cast(self.base_dtype)
        return Linear.from_tensors(w.detach(), self.bias)

    def base_nbytes(self) -> int:
        """Bytes the frozen base weight takes as stored: NF4 codes and scales under QLoRA, else its
        elements times the dtype's size (the bias is not counted). `lora_stats` sums these."""
        if self.nf4 is not None:
            return self.nf4.nbytes()
        return self.weight.size * _itemsize(self.weight.dtype)

    def base_numel(self) -> int:
        """Elements of the base weight (in_features x out_features), quantised or not."""
        return self.in_features * self.out_features

    def extra_repr(self) -> str:
        """Sizes, rank and ", nf4" for a quantised base, as `print(model)` shows them."""
        q = ", nf4" if self.nf4 is not None else ""
        return f"in={self.in_features}, out={self.out_features}, r={self.r}{q}"


def kaiming_bound(fan_in: int) -> float:
    """The bound of lora_A's init (PEFT: kaiming_uniform_(a=sqrt(5))): 1 / sqrt(fan_in)."""
    return 1 / math.sqrt(fan_in)
