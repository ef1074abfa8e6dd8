"""A generation's device state and its captured steps, kept by the model between calls.

Recording a step (running the model's forward to record ~30 layers of ops, then the
capture's analysis of every live tensor) costs far more than replaying it: hundreds of
milliseconds against well under one. `br.compile` replays a step only after two recordings
agree, so a state made afresh per `generate` call would pay two recordings every call, one
of them before the first token. So the state (the KV cache, the read mask, the offsets,
the finished rows, the tokens seen, the sampling key) lives in `DecodeState`, which the
model keeps after a call: the next call whose `signature` is the same (batch, cache
length, sampling settings, EOS ids, device, the model's own modules and tensors, the
train/eval and requires_grad epoch) resets the state's values in place (`_assign`, new
values into the same Tensor objects the captures read) and replays its steps from the
first: the prompt's (captured per prompt length), the decode step and the block of
DECODE_BLOCK decode steps. A call with another
signature drops the kept state first (its cache memory is freed before the new cache is
asked for), and a call made while the kept state is in use (a second thread, or a stream
not yet finished) gets a private state of its own.

The cache is not cleared on reuse: the prefill writes every slot (the prompt's, then
zeros), so its graph is the same whether the cache is new or kept.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import functional as F
from .._compile import compile as capture
from .._recorder import epoch
from .._tensor import Tensor
from . import _sampling
from ._kv_cache import CacheSpec, KVCache

DECODE_BLOCK = 8
"""Decode steps captured as one graph (`DecodeState.decode_block`): one replay and one
message per block. Recording a block costs this many steps' recording (twice, as every
capture), and up to this many - 1 steps at the end of a call run one by one."""


class DecodeState:
    """The device state of one generation shape and the step captured over it.

    Args:
        spec: the model's cache spec.
        batch, length: rows and cache slots (prompt + max_new_tokens).
        settings: (do_sample, temperature, top_k, top_p, repetition_penalty, eos ids, pad
            id): what the captured step's graph depends on besides tensors.
    """

    def __init__(
        self, model: Any, dev: Any, spec: CacheSpec, batch: int, length: int, settings: tuple
    ) -> None:
        self.model, self.dev = model, dev
        self.signature = signature(model, dev, batch, length, settings)
        do_sample, temperature, top_k, top_p, penalty, eos, pad = settings
        self.do_sample, self.temperature, self.top_k, self.top_p = (
            do_sample, temperature, top_k, top_p,
        )  # fmt: skip
        self.penalty, self.eos, self.pad = penalty, list(eos), pad
        self.busy = False
        self.cache = KVCache(spec, batch, length, dev)
        vocab = int(model.config.vocab)
        self.readable = dev.tensor(np.ones((batch, length), bool))
        self.offset = dev.tensor(np.zeros((batch, 1), np.int64))
        self.seen: Tensor | None = None
        if penalty != 1.0:
            self.seen = dev.tensor(np.zeros((batch, vocab), bool))
            self.vocab_ids = dev.tensor(np.arange(vocab, dtype=np.int64)[None])
        self.done = dev.tensor(np.zeros((batch, 1), bool)) if eos else None
        self.base_key = dev.tensor(np.int64(0)) if do_sample else None
        self.prefill = capture(self._prefill)
        self.decode = capture(self._decode)
        self.decode_block = capture(self._decode_block)

    def release(self) -> None:
        """Let go of the device state now (the captured step refers back to this object, so
        waiting for the garbage collector would hold the cache's memory meanwhile)."""
        self.prefill.reset()
        self.decode.reset()
        self.decode_block.reset()
        for name in ("cache", "readable", "offset", "seen", "vocab_ids", "done", "base_key"):
            self.__dict__.pop(name, None)
        self.__dict__.pop("decode", None)
        self.__dict__.pop("decode_block", None)
        self.__dict__.pop("prefill", None)

    def reset(self, ids: np.ndarray, mask: np.ndarray, key: int | None) -> None:
        """New values for a new call (prompts `ids` (B, T), their attention `mask`), into the
        same Tensor objects, so the captured step reads them."""
        dev, (b, t) = self.dev, ids.shape
        readable = np.ones((b, self.cache.max_len), bool)
        readable[:, :t] = mask
        self.readable._assign(dev.tensor(readable))
        real = mask.sum(axis=1, keepdims=True)
        self.offset._assign(dev.tensor((real - t).astype(np.int64)))
        if self.seen is not None:
            seen = np.zeros(self.seen.shape, bool)
            np.put_along_axis(seen, ids, True, axis=1)  # padding too, as transformers
            self.seen._assign(dev.tensor(seen))
        if self.done is not None:
            self.done._assign(dev.tensor(np.zeros((b, 1), bool)))
        if self.base_key is not None:
            from ._init import next_key

            self.base_key._assign(next_key(dev) if key is None else dev.tensor(np.int64(key)))

    def choose(self, logits: Tensor, index: Tensor | int) -> Tensor:
        """The next token (B, 1) int64 from the last position's logits (B, vocab); updates
        the finished rows and the tokens seen. `index`: which new token this is (0 first)."""
        b = logits.shape[0]
        if self.seen is not None:
            logits = _sampling.repetition_penalty(logits, self.seen, self.penalty)
        if self.do_sample:
            if self.temperature != 1.0:
                logits = logits * (1.0 / self.temperature)
            if self.top_k:
                logits = _sampling.top_k_top_p(logits, self.top_k, self.top_p)
            assert self.base_key is not None
            token = _sampling.gumbel_argmax(logits, self.base_key + index)
        else:
            token = logits.argmax(axis=-1)
        token = token.reshape(b, 1)
        if self.done is not None:
            token = F.where(self.done, self.pad, token)
            ended = self.done
            for e in self.eos:
                ended = ended | (token == e)
            self.done._assign(ended)
        if self.seen is not None:
            self.seen._assign(self.seen | (self.vocab_ids == token))
        return token

    def _prefill(self, ids: Tensor, positions: Tensor, mask: Tensor) -> Tensor:
        """The prompts' step (captured too, per prompt length): `ids` (B, T) into slots
        [0, T) at position ids `positions` (B, T) under `mask` (B, 1, T, L); the first token."""
        step = self.cache.prefill(positions, mask)
        return self.choose(self.model.forward_cached(ids, step), 0)

    def _decode(self, token: Tensor, slot: Tensor, index: Tensor) -> Tensor:
        """One decode step (the captured function): `token` (B, 1) at cache slot `slot`."""
        step = self.cache.decode(slot, slot + self.offset, self.readable)
        return self.choose(self.model.forward_cached(token, step), index)

    def _decode_block(self, token: Tensor, slot: Tensor, index: Tensor) -> tuple[Tensor, Tensor]:
        """DECODE_BLOCK decode steps in one captured graph: the tokens (B, DECODE_BLOCK) and
        the last one (B, 1), the next block's argument."""
        columns = []
        for i in range(DECODE_BLOCK):
            token = self._decode(token, slot + i, index + i)
            columns.append(token)
        return F.cat(columns, axis=1), token


def signature(model: Any, dev: Any, batch: int, length: int, settings: tuple) -> tuple:
    """What a kept state must match to be reused: the shapes and settings, the device, the
    compile epoch (train/eval, requires_grad) and the identity of every module and tensor of
    the model (an adapter attached or a weight replaced by another object records anew)."""
    parts = tuple(id(m) for _, m in model.named_modules())
    tensors = tuple(id(t) for _, t in model.named_tensors())
    return (batch, length, settings, id(dev), epoch(), parts, tensors)


def acquire(
    model: Any, dev: Any, spec: CacheSpec, batch: int, length: int, settings: tuple
) -> DecodeState:
    """The model's kept state when its signature matches and no other call uses it; else a
    new one, kept in place of the old (whose memory is let go first) unless the old one
    is in use."""
    kept: DecodeState | None = model.__dict__.get("_decode_state")
    if kept is not None:
        if not kept.busy and kept.signature == signature(model, dev, batch, length, settings):
            kept.busy = True
            return kept
        if not kept.busy:  # its cache is freed before the new one is asked for
            model.__dict__["_decode_state"] = None
            kept.release()
            kept = None
    state = DecodeState(model, dev, spec, batch, length, settings)
    state.busy = True
    if kept is None:
        model.__dict__["_decode_state"] = state
    return state


def done_with(model: Any, state: DecodeState) -> None:
    """A call ended: the kept state is free for the next; a private one is let go."""
    state.busy = False
    if model.__dict__.get("_decode_state") is not state:
        state.release()


__all__ = ["DecodeState", "acquire", "done_with", "signature"]
