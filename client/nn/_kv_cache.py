"""The KV cache of a causal LM: preallocated on the device, static in shape.

Each layer keeps its keys and values as two device tensors of shape
(batch, n_kv_heads, max_len, head_dim), zeros at first and written in place (`_assign`) as
tokens arrive. The shape never changes during a generation, so a decode step records the
same graph at every position and `br.compile` replays it with the position as a binding; on
a remote device the cache never leaves the server.

How a model uses it (what `generate` needs from a causal LM; see `_generate.py`):

- `cache_spec() -> CacheSpec`: layers, kv heads, head size, most positions, dtype.
- `forward_cached(ids (B, T) int64, step: CacheStep) -> logits (B, vocab)` of the last
  position: embeddings at `step.positions` (B, T) (or rope angles at them), then for each
  layer `i` its attention calls `step.layer(i).attend(q, k, v)` with q (B, H, T, D) and
  k, v (B, H_kv, T, D) after any rope; `attend` writes k and v at the step's slots and
  returns the attention output (B, H, T, D) over every slot the mask lets each query see.

Everything a layer needs (slots to write, the mask) is made once per step here, shared by
all layers, so each attention's cache path is the one call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import functional as F
from .._tensor import Tensor
from ..protocol import dtypes


@dataclass(frozen=True)
class CacheSpec:
    """The cache a model needs: `n_layer` x (keys, values) of (B, n_kv_head, L, head_dim)."""

    n_layer: int
    n_kv_head: int
    head_dim: int
    max_positions: int
    """The most positions the model can embed (its context); a cache is never longer."""
    dtype: str = "float32"

    def nbytes(self, batch: int, max_len: int) -> int:
        """Device bytes of a cache for `batch` rows of `max_len` slots."""
        per = math.prod((batch, self.n_kv_head, max_len, self.head_dim))
        return 2 * self.n_layer * per * dtypes.itemsize(self.dtype)


class KVCacheDoesNotFit(MemoryError):
    """A KV cache larger than the memory its device has left: on a server, the least of
    what the session's quota (``--session-memory``), its peer's share (``--peer-memory``)
    and the server's memory limit (``--memory-limit``) leave. Raised before the cache is
    made, so no prefill runs."""

    def __init__(self, needed: int, free: int, limit: str, what: str) -> None:
        self.needed, self.free, self.limit = needed, free, limit
        super().__init__(
            f"KVCacheDoesNotFit: the KV cache needs {needed} bytes ({what}) but {free} bytes "
            f"are free under {limit}: use fewer rows or max_new_tokens"
        )


def check_cache_fits(spec: CacheSpec, batch: int, max_len: int, device: Any) -> None:
    """Raise KVCacheDoesNotFit when a (batch, max_len) cache would not fit in the memory
    `device` has left (`memory_room`); nothing to check on a device without a limit."""
    room = device.memory_room()
    if room is None:
        return
    free, limit = room
    needed = spec.nbytes(batch, max_len)
    if needed > free:
        what = (
            f"{spec.n_layer} layers x keys and values x {batch} rows x {spec.n_kv_head} kv "
            f"heads x {max_len} slots x {spec.head_dim} x {spec.dtype}"
        )
        raise KVCacheDoesNotFit(needed, free, limit, what)


class KVCache:
    """Keys and values of every layer for `batch` rows of `max_len` slots, on `device`.

    `slots` is arange(max_len) on the device, uploaded once: steps compare it with their
    position to find the slot they write and the slots they may read.

    Raises:
        ValueError: more slots than the model's context.
        KVCacheDoesNotFit: the cache is larger than the device's memory limits leave free
            (asked before anything is allocated).
    """

    def __init__(self, spec: CacheSpec, batch: int, max_len: int, device: Any) -> None:
        if max_len > spec.max_positions:
            raise ValueError(
                f"KV cache: {max_len} positions exceed the model's {spec.max_positions}"
            )
        check_cache_fits(spec, batch, max_len, device)
        self.spec, self.batch, self.max_len, self.device = spec, batch, max_len, device
        shape = (batch, spec.n_kv_head, max_len, spec.head_dim)
        self.keys = [device.zeros(shape, spec.dtype) for _ in range(spec.n_layer)]
        self.values = [device.zeros(shape, spec.dtype) for _ in range(spec.n_layer)]
        self.slots = device.tensor(np.arange(max_len, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        """Device bytes the keys and values of all layers take (2 x layers x batch x kv heads x
        max_len x head_dim x itemsize): what a `generate` call costs in memory before it starts."""
        return self.spec.nbytes(self.batch, self.max_len)

    def prefill(self, positions: Tensor, mask: Tensor) -> CacheStep:
        """A step writing slots [0, T) for ids (B, T): `positions` (B, T) int64 position
        ids, `mask` (B, 1, T, max_len) bool (True: query t may read slot l)."""
        t = positions.shape[1]
        queries = self.device.tensor(np.arange(t, dtype=np.int64).reshape(t, 1))
        return CacheStep(self, 0, positions, mask, None, queries)

    def decode(self, position: Tensor, position_ids: Tensor, readable: Tensor) -> CacheStep:
        """A one-token step at slot `position` (0-d int64, a binding in a captured step).

        Args:
            position_ids: (B, 1) int64 position ids of the token.
            readable: (B, max_len) bool, the slots that hold real tokens once written (the
                prompt's attention mask padded with True); the mask is these, up to and
                including `position`.
        """
        here = self.slots == position
        mask = ((self.slots <= position) & readable) | here
        b = readable.shape[0]
        return CacheStep(
            self, position, position_ids, mask.reshape(b, 1, 1, self.max_len),
            here.reshape(1, 1, self.max_len, 1), position.reshape(1, 1),
        )  # fmt: skip


@dataclass(frozen=True)
class CacheStep:
    """What one forward over the cache passes to every layer: where its T tokens go
    (`start`, a Python int for a prefill or a 0-d tensor for a decode step), their position
    ids, the read mask (B, 1, T, L), for a decode step the one-hot slot (1, 1, L, 1), and
    the slot of each query (T, 1) for sliding windows."""

    cache: KVCache
    start: int | Tensor
    positions: Tensor
    mask: Tensor
    slot: Tensor | None
    queries: Tensor
    windowed: dict[int, Tensor] = field(default_factory=dict)
    """Masks narrowed to a sliding window, made once per window and step."""

    def layer(self, index: int) -> LayerCache:
        """Layer ``index``'s view of this step, passed to its attention (`LayerCache.attend`)."""
        return LayerCache(self, index)

    def last(self, x: Tensor) -> Tensor:
        """The hidden states (B, T, C) the model's head turns into logits: the last
        position's (B, C), the only one a generation step needs."""
        return x[:, -1]

    def mask_for(self, window: int | None) -> Tensor:
        """The read mask, narrowed to slots l > q - window for a query at slot q (a
        sliding-window layer, as transformers counts it: over cache slots)."""
        if window is None or window >= self.cache.max_len:
            return self.mask
        if window not in self.windowed:
            near = self.cache.slots > (self.queries - window)  # (T, L)
            self.windowed[window] = self.mask & near
        return self.windowed[window]


@dataclass(frozen=True)
class LayerCache:
    """One layer's view of a step; attention calls `attend`."""

    step: CacheStep
    index: int

    def attend(self, q: Tensor, k: Tensor, v: Tensor, window: int | None = None) -> Tensor:
        """Write k, v (B, H_kv, T, D) at the step's slots, then attention of q (B, H, T, D)
        over the whole cache under the step's mask -> (B, H, T, D). `window`: the layer's
        sliding window, if it has one."""
        return cached_attention(q, k, v, self.step, self.index, window)


def cached_attention(
    q: Tensor, k: Tensor, v: Tensor, step: CacheStep, layer: int, window: int | None = None
) -> Tensor:
    """The cache write and read of one attention layer (see the module docstring).

    Grouped-query attention (H = g * H_kv) reads the cache as it lies: the g query heads of
    a kv head become g * T rows of one matmul, so no kv head is ever repeated in memory.
    The softmax runs in float32 whatever the cache's dtype (transformers' eager attention).
    """
    cache = step.cache
    keys = _write(cache.keys[layer], k, step)
    values = _write(cache.values[layer], v, step)
    cache.keys[layer]._assign(keys)
    cache.values[layer]._assign(values)
    return attention_over(q, keys, values, step.mask_for(window))


def attention_over(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> Tensor:
    """Attention of q (B, H, T, D) over keys and values (B, H_kv, L, D) where `mask`
    (B or 1, 1, T, L) is True -> (B, H, T, D): the read half of `cached_attention`, shared
    with forwards whose keys arrive another way (`_past_step`, the ONNX decoder export)."""
    b, h, t, d = q.shape
    h_kv, slots = keys.shape[1], keys.shape[2]
    if h % h_kv:
        raise ValueError(f"attention: {h} query heads are not a multiple of {h_kv} kv heads")
    g = h // h_kv
    qg = q.reshape(b, h_kv, g * t, d)
    scores = (qg @ keys.transpose(-1, -2)) * (1.0 / math.sqrt(d))
    scores = scores.reshape(b, h_kv, g, t, slots)
    scores = F.where(mask.reshape(mask.shape[0], 1, 1, t, slots), scores, float("-inf"))
    if scores.dtype == "float32":
        weights = F.softmax(scores, axis=-1)
    else:
        weights = F.softmax(scores.cast("float32"), axis=-1).cast(q.dtype)
    return (weights.reshape(b, h_kv, g * t, slots) @ values).reshape(b, h, t, d)


def _write(cache: Tensor, new: Tensor, step: CacheStep) -> Tensor:
    """`cache` with `new` (B, H_kv, T, D) in slots [start, start + T)."""
    if step.slot is not None:  # a decode step: one token at a slot the device knows
        if new.shape[2] != 1:
            raise ValueError(f"KV cache: a decode step writes one token, got {new.shape[2]}")
        return F.where(step.slot, new, cache)
    start, t, slots = int(step.start), new.shape[2], cache.shape[2]
    if start + t > slots:
        raise ValueError(f"KV cache: {start + t} positions exceed its {slots} slots")
    if start == 0 and t == slots:
        return new
    if start == 0:  # a prompt: the slots past it start empty, whatever a kept cache held
        b, h, _, d = new.shape
        return F.cat([new, step.cache.device.zeros((b, h, slots - t, d), cache.dtype)], axis=2)
    parts = [p for p in (cache[:, :, :start] if start else None, new) if p is not None]
    if start + t < slots:
        parts.append(cache[:, :, start + t :])
    return F.cat(parts, axis=2)


def prefill_mask(attention_mask: np.ndarray, max_len: int) -> np.ndarray:
    """(B, 1, T, max_len) bool for a prompt at slots [0, T): query t reads slot l <= t when
    l holds a real token, and always its own slot (so a padding row attends to itself and
    stays finite instead of a softmax over nothing)."""
    b, t = attention_mask.shape
    real = np.zeros((b, max_len), bool)
    real[:, :t] = attention_mask.astype(bool)
    causal = np.arange(max_len)[None, :] <= np.arange(t)[:, None]
    own = np.arange(max_len)[None, :] == np.arange(t)[:, None]
    return ((causal[None] & real[:, None, :]) | own[None])[:, None]


__all__ = [
    "CacheSpec",
    "CacheStep",
    "KVCache",
    "KVCacheDoesNotFit",
    "LayerCache",
    "attention_over",
    "cached_attention",
    "check_cache_fits",
    "prefill_mask",
]
