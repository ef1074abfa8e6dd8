"""A forward whose keys and values come in and go out as tensors ("past_key_values" in,
"present" out), the form optimum exports decoders in: what the ONNX decoder export traces.

`generate` keeps its cache on the device in preallocated slots (`_kv_cache`); a runtime that
only runs a file (onnxruntime) has nowhere to keep it, so each call takes the cache so far
(B, H_kv, P, D) per layer and returns it grown by the S new tokens. The model's own
`forward_cached` is used unchanged: `PastStep` is a step of the same shape as
`_kv_cache.CacheStep` (positions, a view per layer, a read mask, sliding windows), whose
layers concatenate instead of writing slots, and whose head sees every position.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import functional as F
from .._tensor import Tensor
from ._kv_cache import attention_over


class PastStep:
    """S new tokens after P cached ones: `past` (keys, values) (B, H_kv, P, D) per layer,
    `attention_mask` (B, P + S) (0: padding), `position_ids` (B, S); `slots` is
    arange(context) on the device (sliced to P + S, so sizes follow the inputs' lengths)."""

    def __init__(
        self,
        past: list[tuple[Tensor, Tensor]],
        attention_mask: Tensor,
        position_ids: Tensor,
        slots: Tensor,
    ) -> None:
        b, s = position_ids.shape
        p = past[0][0].shape[2]
        self.past = past
        self.positions = position_ids
        self.presents: list[tuple[Tensor, Tensor] | None] = [None] * len(past)
        self.key_slots = slots[: p + s]  # (P + S,)
        self.queries = slots[p : p + s].reshape(s, 1)  # the slot of each new token
        real = (attention_mask != 0).reshape(b, 1, 1, p + s)
        causal = self.key_slots <= self.queries  # (S, P + S)
        own = self.key_slots == self.queries  # a padding query reads itself: stays finite
        self.mask = (causal & real) | own  # (B, 1, S, P + S), as prefill_mask and decode
        self.windowed: dict[int, Tensor] = {}

    def layer(self, index: int) -> PastLayer:
        """Layer `index`'s view of this step (what its attention calls `attend` on)."""
        return PastLayer(self, index)

    def last(self, x: Tensor) -> Tensor:
        """Every position's hidden states: the export's logits are (B, S, vocab)."""
        return x

    def mask_for(self, window: int | None) -> Tensor:
        """The read mask, narrowed to slots l > q - window (as `CacheStep.mask_for`)."""
        if window is None:
            return self.mask
        if window not in self.windowed:
            self.windowed[window] = self.mask & (self.key_slots > (self.queries - window))
        return self.windowed[window]

    def present(self) -> list[Tensor]:
        """Keys and values of every layer (B, H_kv, P + S, D), in layer order, keys first."""
        if any(p is None for p in self.presents):
            raise ValueError("PastStep: a layer's attention was not run through this step")
        return [t for pair in self.presents if pair is not None for t in pair]


@dataclass(frozen=True)
class PastLayer:
    """One layer's view of a `PastStep`; attention calls `attend`."""

    step: PastStep
    index: int

    def attend(self, q: Tensor, k: Tensor, v: Tensor, window: int | None = None) -> Tensor:
        """The layer's past keys and values with k, v (B, H_kv, S, D) appended (kept as its
        present), then attention of q (B, H, S, D) over them under the step's mask."""
        past_k, past_v = self.step.past[self.index]
        keys = F.cat([past_k, k], axis=2)
        values = F.cat([past_v, v], axis=2)
        self.step.presents[self.index] = (keys, values)
        return attention_over(q, keys, values, self.step.mask_for(window))


__all__ = ["PastLayer", "PastStep"]
