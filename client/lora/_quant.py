"""NF4 storage for QLoRA base weights, with double-quantised block scales.

A weight is flattened and split into blocks of 64; each block keeps its absmax (a float32
scale) and one 4-bit NF4 code per element. The scales are then quantised themselves
(QLoRA's double quantisation): their mean is subtracted and the rest stored as int8 in blocks
of 256 with one float32 scale each. Bits per parameter: 4 + 8/64 + 32/(64*256) ~ 4.127.
Everything runs as registry ops on the weight's device; the forward dequantises with the
registry's dequantize ops, so no float copy of the weight is kept between steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from burn_remote.protocol.ops_nn import NF4_CODEBOOK, QUANT_BLOCK

from .. import functional as F
from .._autograd import no_grad
from .._ops import call
from .._tensor import Tensor

SCALE_BLOCK = 256
"""Block of the second quantisation (of the NF4 absmax scales)."""
NF4_HALF_GAP = float(np.max(np.diff(NF4_CODEBOOK)) / 2)
"""Worst-case rounding of a normalised value: half the widest gap between adjacent levels."""


def _pad_to(x: Tensor, multiple: int) -> Tensor:
    extra = -x.shape[0] % multiple
    return F.pad(x, ((0, extra),)) if extra else x


@dataclass
class NF4Weight:
    """The stored form of one weight; the tensors are registered as the layer's buffers."""

    shape: tuple[int, ...]
    codes: Tensor
    """uint8, two 4-bit codes a byte, the flat weight padded to a multiple of 64."""
    scales_q: Tensor
    """int8, one per 64-block: (absmax - offset) quantised in blocks of 256."""
    scales_scale: Tensor
    """float32, the absmax of each 256-block of centred scales."""
    offset: Tensor
    """float32 0-d: the mean absmax, subtracted before the second quantisation."""

    @classmethod
    def quantize(cls, w: Tensor) -> NF4Weight:
        """Quantise ``w`` (any shape, any float dtype) on its own device, without recording a
        gradient: NF4 codes per block of 64, their absmax scales double-quantised to int8 per
        block of 256. The flat weight is padded with zeros to whole blocks."""
        with no_grad():
            flat = _pad_to(w.detach().reshape(-1).cast("float32"), QUANT_BLOCK)
            codes, absmax = call("quantize_nf4", flat, block=QUANT_BLOCK)
            offset = absmax.mean()
            n_blocks = absmax.shape[0]
            q, s = call("quantize_int8", _pad_to(absmax - offset, SCALE_BLOCK), block=SCALE_BLOCK)
            q = q[:n_blocks] if q.shape[0] != n_blocks else q
        return cls(tuple(w.shape), codes, q, s, offset)

    @property
    def numel(self) -> int:
        """Elements of the original weight (the padding to whole blocks excluded)."""
        return int(np.prod(self.shape))

    def absmax(self) -> Tensor:
        """The NF4 block scales, reconstructed from their int8 form."""
        n_blocks = self.scales_q.shape[0]
        padded = _pad_to(self.scales_q, SCALE_BLOCK)
        a = call(
            "dequantize_int8",
            padded,
            self.scales_scale,
            block=SCALE_BLOCK,
            shape=padded.shape,
            dtype="float32",
        )
        return (a[:n_blocks] if padded.shape[0] != n_blocks else a) + self.offset

    def dequantize(self, dtype: str = "float32") -> Tensor:
        """The weight back as floats of ``dtype``, in its original shape; each element is within
        half the widest NF4 level gap (`NF4_HALF_GAP`) times its block's absmax of the original."""
        n_padded = self.codes.shape[0] * 2
        w = call(
            "dequantize_nf4",
            self.codes,
            self.absmax(),
            block=QUANT_BLOCK,
            shape=(n_padded,),
            dtype=dtype,
        )
        return (w[: self.numel] if n_padded != self.numel else w).reshape(self.shape)

    def nbytes(self) -> int:
        """Device bytes of the stored form (codes, int8 scales, their float32 scales and offset)."""
        return sum(t.size * _itemsize(t.dtype) for t in self.tensors().values())

    def bits_per_param(self) -> float:
        """Stored bits per original element: ~4.127 for a large weight (4 + 8/64 + 32/(64*256)),
        more for a small one, whose padding and offset weigh more."""
        return 8 * self.nbytes() / self.numel

    def tensors(self) -> dict[str, Tensor]:
        """The four stored tensors by name (``codes``, ``scales_q``, ``scales_scale``, ``offset``),
        registered by `LoraLinear` as ``weight_<name>`` buffers so they save and load with the model."""
        return {
            "codes": self.codes,
            "scales_q": self.scales_q,
            "scales_scale": self.scales_scale,
            "offset": self.offset,
        }


def _itemsize(dtype: str) -> int:
    from burn_remote.protocol import dtypes

    return np.dtype(dtypes.to_numpy(dtype)).itemsize
