"""`generate`: prefill, then a captured decode step replayed until EOS or the length.

A causal LM plugs in by subclassing `GenerationMixin` and providing the two methods the KV
cache module describes (`_kv_cache.py`):

- `cache_spec() -> CacheSpec` (layers, kv heads, head size, most positions, dtype);
- `forward_cached(ids (B, T), step: CacheStep) -> logits (B, vocab)` of the last position,
  where each attention layer `i` calls `step.layer(i).attend(q, k, v)`.

The loop, and why it is shaped so:

1. The cache is preallocated for prompt + max_new_tokens slots, so every decode step has the
   same shapes and records the same graph. The step (model forward, logits processors, the
   choice of token, the EOS and repetition bookkeeping) is one `br.compile`d function whose
   arguments are the previous token (a device tensor) and two Python ints (the slot and the
   token's index) that become bindings: after two recordings it replays. DECODE_BLOCK
   steps are captured together as a second function (the steps in a row, one graph), which
   the loop calls while a whole block fits (single steps finish the call): on a remote
   device a block is one small ExecuteGraph, and the client's work per token is a replay's
   share, not a replay. The model keeps the state and its captured
   step after the call (`_decode_state`), so a later call of the same shape and settings
   records nothing: it resets the state's values and replays from its first step.
2. The chosen token stays on the device and is the next step's argument, so nothing waits
   for it. The client reads tokens in blocks of TOKEN_BLOCK (the prefill's token alone, for
   a fast first token). On a remote device each read is asked for before the next block
   of steps is queued and taken after: the server runs messages in order, so the reply
   comes as soon as its tokens are computed, and the device has the next block meanwhile
   (a local device computes as the steps are queued, so its tokens are read and given
   first). A block that shows
   every row done ends the loop, and the tokens past the last EOS are cut off (at most one
   read's worth of steps is wasted).
3. Batches are left-padded: position ids count only real tokens (the attention mask's
   cumulative sum, as transformers), and a slot is readable when the mask says it holds a
   real token. A finished row keeps emitting `pad_token_id`, as transformers does.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from typing import Any

import numpy as np

from .. import functional as F
from .._autograd import no_grad
from .._tensor import Tensor
from . import _decode_state, _sampling
from ._kv_cache import prefill_mask

FROM_CONFIG: Any = object()
"""`eos_token_id`'s default: take it from the model's config.json (None means none)."""
TOKEN_BLOCK = 32
"""Tokens read from the device in one read (after the first, which is read alone). Each
read of a remote device costs the client a round trip of packets (~2 ms of its CPU on a
loaded 2-core host), so this sets the client's CPU per token (`bench/generate.py`) against
how often a stream delivers text."""


class GenerationMixin:
    """`generate` for a causal LM that has `cache_spec` and `forward_cached`."""

    generation_stats: dict[str, int] | None = None
    """The last `generate` call's counts: new tokens (per row, before trimming), decode
    steps queued, the captured calls they took (blocks of DECODE_BLOCK steps and single
    steps), of those calls recorded and replayed, token reads, and the cache's bytes."""

    def generate(
        self,
        input_ids: Any,
        max_new_tokens: int = 20,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = 50,
        top_p: float = 1.0,
        repetition_penalty: float = 1.0,
        eos_token_id: Any = FROM_CONFIG,
        pad_token_id: int | None = None,
        attention_mask: Any = None,
        key: int | None = None,
        streamer: Any = None,
    ) -> np.ndarray:
        """Continue each prompt by up to `max_new_tokens` tokens; returns (B, T + new) int64,
        the prompts followed by the new tokens, as transformers' `generate`.

        Args:
            input_ids: (B, T) or (T,) token ids (array, list or tensor), left-padded.
            do_sample: draw from the processed distribution (else greedy, the argmax).
            temperature, top_k, top_p: transformers' warpers, when sampling (top_k 0 or
                None: no top-k; top_p < 1 then needs a top_k, see `_sampling`).
            repetition_penalty: transformers' penalty on every token already in a row.
            eos_token_id: one id or several; a row ends at its first. Default: the
                model's config.json `eos_token_id`, if any; None: no EOS (as transformers).
            pad_token_id: what a finished row emits; default the first EOS id.
            attention_mask: (B, T), 0 on the left padding; default all ones.
            key: the sampling key; the same key draws the same tokens on every device.
                Default: the next key of the seeded generator (`burn_remote.manual_seed`).
            streamer: an object with `put(ids)` and `end()` (transformers' TextStreamer and
                TextIteratorStreamer qualify): given the prompts first, then each new token
                (B,) in order as blocks arrive, then `end()`.
        Raises:
            ValueError: a bad argument, right padding, or more tokens than the model's
                context holds.
        """
        gen = _Generation(
            self, input_ids, attention_mask, max_new_tokens, do_sample, temperature, top_k,
            top_p, repetition_penalty, eos_token_id, pad_token_id, key,
        )  # fmt: skip
        with no_grad():
            out = gen.run(streamer)
        self.generation_stats = gen.stats
        return out

    def stream(
        self,
        input_ids: Any,
        max_new_tokens: int = 20,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = 50,
        top_p: float = 1.0,
        repetition_penalty: float = 1.0,
        eos_token_id: Any = FROM_CONFIG,
        pad_token_id: int | None = None,
        attention_mask: Any = None,
        key: int | None = None,
    ) -> Iterator[np.ndarray]:
        """`generate` as an iterator: each new token (B,) int64, in order, as soon as its
        block is read (the first alone, for a fast first token), the same tokens `generate`
        returns. The device keeps a block of steps queued ahead while the caller handles
        a token, so a remote device is never waited on per token. Stopping the iteration
        early stops the generation (nothing more is queued). Arguments as `generate`'s;
        `generation_stats` is set when the iteration ends."""
        gen = _Generation(
            self, input_ids, attention_mask, max_new_tokens, do_sample, temperature, top_k,
            top_p, repetition_penalty, eos_token_id, pad_token_id, key,
        )  # fmt: skip
        return self._stream(gen)

    def generate_text(
        self,
        prompt: str | list[dict[str, Any]],
        max_new_tokens: int = 20,
        tokenizer: Any = None,
        skip_special_tokens: bool = True,
        **kwargs: Any,
    ) -> str:
        """The text that continues `prompt` (only the new text): `stream_text` joined."""
        return "".join(
            self.stream_text(prompt, max_new_tokens, tokenizer, skip_special_tokens, **kwargs)
        )

    def stream_text(
        self,
        prompt: str | list[dict[str, Any]],
        max_new_tokens: int = 20,
        tokenizer: Any = None,
        skip_special_tokens: bool = True,
        **kwargs: Any,
    ) -> Iterator[str]:
        """Generate from text and yield the new text piece by piece as tokens arrive (what a
        chat UI prints; as transformers' TextIteratorStreamer with skip_prompt).

        Args:
            prompt: a string (tokenized with the tokenizer's special tokens, as
                transformers' `tokenizer(prompt)`), or chat messages ([{"role": "user",
                "content": ...}, ...]) rendered through the tokenizer's chat template with
                the generation prompt added (`apply_chat_template`).
            tokenizer: a `burn_remote.tokenizer.Tokenizer` or its directory; default the
                one in the directory the model was loaded from.
            skip_special_tokens: leave special tokens (EOS, chat markers) out of the text.
            kwargs: `generate`'s keywords (do_sample, temperature, key, ...). eos_token_id
                defaults to the config's EOS ids plus the tokenizer's EOS token.
        Raises:
            ValueError: no tokenizer, a prompt that is neither text nor messages, or a bad
                `generate` argument.
            ChatTemplateError: messages given and the tokenizer has no chat template.
        """
        from . import _generate_text as text

        tok = text.tokenizer_of(self, tokenizer)
        ids = text.prompt_ids(tok, prompt, int(self.config.vocab))  # type: ignore[attr-defined]
        kwargs["eos_token_id"] = text.eos_ids(
            self, tok, kwargs.get("eos_token_id", FROM_CONFIG), FROM_CONFIG
        )
        columns = self.stream(ids, max_new_tokens, **kwargs)
        return text.text_pieces(tok, columns, skip_special_tokens)

    def _stream(self, gen: _Generation) -> Iterator[np.ndarray]:
        tokens = gen.tokens()
        try:
            while True:
                with no_grad():  # around the device work only, never the caller's code
                    column = next(tokens, None)
                if column is None:
                    return
                yield column
        finally:
            tokens.close()
            self.generation_stats = gen.stats


def _as_ids(input_ids: Any) -> np.ndarray:
    ids = input_ids.numpy() if isinstance(input_ids, Tensor) else np.asarray(input_ids)
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or ids.shape[1] == 0 or ids.dtype.kind not in "iu":
        raise ValueError(f"generate: input_ids must be (batch, tokens) integers, got {ids.shape}")
    return ids.astype(np.int64)


def _as_mask(attention_mask: Any, shape: tuple[int, ...]) -> np.ndarray:
    if attention_mask is None:
        return np.ones(shape, bool)
    m = attention_mask.numpy() if isinstance(attention_mask, Tensor) else attention_mask
    mask = np.asarray(m)
    if mask.ndim == 1:
        mask = mask[None]
    if mask.shape != shape:
        raise ValueError(f"generate: attention_mask is {mask.shape}, input_ids {shape}")
    mask = mask.astype(bool)
    if not mask[:, -1].all():
        raise ValueError(
            "generate: right padding (attention_mask 0 at the end of a row): a decoder-only "
            "model continues from the last token, so pad on the left"
        )
    if (np.diff(mask.astype(np.int8), axis=1) < 0).any():
        raise ValueError("generate: attention_mask has a 0 after a 1; pad on the left only")
    return mask


class _Generation:
    """One `generate` call: its inputs checked, its device state, its loop."""

    def __init__(
        self, model: Any, input_ids: Any, attention_mask: Any, max_new_tokens: int,
        do_sample: bool, temperature: float, top_k: int | None, top_p: float,
        repetition_penalty: float, eos_token_id: Any, pad_token_id: int | None, key: int | None,
    ) -> None:  # fmt: skip
        self.model = model
        self.ids = _as_ids(input_ids)
        self.mask = _as_mask(attention_mask, self.ids.shape)
        if max_new_tokens < 1:
            raise ValueError(f"generate: max_new_tokens must be at least 1, got {max_new_tokens}")
        spec = model.cache_spec()
        b, t = self.ids.shape
        self.length = t + max_new_tokens
        if self.length > spec.max_positions:
            raise ValueError(
                f"generate: {t} prompt tokens + {max_new_tokens} new exceed the model's "
                f"context of {spec.max_positions} positions"
            )
        self.max_new = max_new_tokens
        vocab = self._vocab()
        if (self.ids < 0).any() or (self.ids >= vocab).any():
            raise ValueError(f"generate: input_ids outside the vocabulary [0, {vocab})")
        self.do_sample = do_sample
        if do_sample:
            if not temperature > 0:
                raise ValueError(f"generate: temperature must be > 0, got {temperature}")
            if not 0 < top_p <= 1:
                raise ValueError(f"generate: top_p must be in (0, 1], got {top_p}")
            top_k = top_k or 0
            if top_k > _sampling.MAX_TOP_K or (top_k == 0 and top_p < 1):
                raise ValueError(
                    f"generate: top_k={top_k} with top_p={top_p}: top-k and top-p run on the "
                    f"device without a sort, for top_k of 1..{_sampling.MAX_TOP_K} (top_p "
                    "needs one); use top_k <= that"
                )
        if not repetition_penalty > 0:
            raise ValueError(f"generate: repetition_penalty must be > 0, got {repetition_penalty}")
        self.temperature, self.top_k, self.top_p = temperature, top_k or 0, top_p
        self.penalty = repetition_penalty
        self.eos = _eos_ids(model, eos_token_id)
        self.pad = pad_token_id if pad_token_id is not None else (self.eos[0] if self.eos else 0)
        self.key = key
        self.dev = _device_of(model)
        self.spec = spec
        self.settings = (
            do_sample, temperature, self.top_k, top_p, repetition_penalty, tuple(self.eos),
            self.pad,
        )  # fmt: skip
        self.reads = self.new = self.steps = 0  # token reads, tokens read, decode steps queued
        self.stats: dict[str, int] = {}

    def _vocab(self) -> int:
        return int(self.model.config.vocab)

    # --- the loop -------------------------------------------------------------------------
    def run(self, streamer: Any) -> np.ndarray:
        b = self.ids.shape[0]
        if streamer is not None:
            streamer.put(self.ids.copy())
        out: list[np.ndarray] = []
        for column in self.tokens():
            out.append(column[:, None])
            if streamer is not None:
                streamer.put(column.copy())
        if streamer is not None:
            streamer.end()
        new = np.concatenate(out, axis=1) if out else np.zeros((b, 0), np.int64)
        return np.concatenate([self.ids, new], axis=1)

    def tokens(self) -> Generator[np.ndarray, None, None]:
        """The new tokens, one (B,) int64 column per step, in order, as their blocks are
        read; ends after the step where the last row met EOS, or at max_new_tokens."""
        dev, b = self.dev, self.ids.shape[0]
        state = _decode_state.acquire(self.model, dev, self.spec, b, self.length, self.settings)
        captures = (state.decode, state.decode_block)
        before = [(c.recordings, c.replays) for c in captures]
        self.steps = 0
        try:
            state.reset(self.ids, self.mask, self.key)
            yield from self._steps(state)
        finally:
            recorded = sum(c.recordings - r for c, (r, _) in zip(captures, before))
            replayed = sum(c.replays - p for c, (_, p) in zip(captures, before))
            self.stats.update(
                decode_steps=self.steps, decode_calls=recorded + replayed,
                decode_recordings=recorded, decode_replays=replayed,
                cache_bytes=state.cache.nbytes,
            )  # fmt: skip
            _decode_state.done_with(self.model, state)

    def _steps(self, state: _decode_state.DecodeState) -> Generator[np.ndarray, None, None]:
        dev, (b, t) = self.dev, self.ids.shape
        positions = np.maximum(np.cumsum(self.mask, axis=1) - 1, 0).astype(np.int64)
        mask = prefill_mask(self.mask, self.length)
        token = state.prefill(dev.tensor(self.ids), dev.tensor(positions), dev.tensor(mask))
        reading: list[Tensor] = [token]  # (B, n) tokens, the next read's
        finished = np.zeros(b, bool)
        index = 1  # the next token's index (the prefill's is 0)
        try:
            while reading:
                block = F.cat(reading, axis=1) if len(reading) > 1 else reading[0]
                # a device that queues reads in order (remote) is asked for the tokens before
                # the next steps are queued and answers while it runs them; one that reads at
                # once (local) gives them before the next steps run
                take = block._numpy_later()
                if take is None:
                    yield from self._take(block.numpy, finished)
                    if self.eos and finished.all():
                        return
                reading, count = [], 0
                while index < self.max_new and count < TOKEN_BLOCK:
                    tokens, token, n = self._queue(state, token, t + index - 1, index)
                    reading.append(tokens)
                    count += n
                    index += n
                if take is not None:
                    yield from self._take(take, finished)
                    if self.eos and finished.all():
                        return
        finally:
            self.stats.update(new_tokens=self.new, reads=self.reads)

    def _queue(
        self, state: _decode_state.DecodeState, token: Tensor, slot: int, index: int
    ) -> tuple[Tensor, Tensor, int]:
        """Queue the next decode call after `token`, for token `index` at cache `slot`: a
        block of DECODE_BLOCK steps while a whole one fits, then single steps. Its tokens
        (B, n), the last of them (B, 1), and n."""
        block = _decode_state.DECODE_BLOCK
        if self.max_new - index >= block:
            tokens, last = state.decode_block(token, slot, index)
            self.steps += block
            return tokens, last, block
        last = state.decode(token, slot, index)
        self.steps += 1
        return last, last, 1

    def _take(self, take: Callable[[], np.ndarray], finished: np.ndarray) -> Iterator[np.ndarray]:
        """Take a read's tokens (B, n) and yield their columns (B,), up to the step where
        the last row ended (`finished` is updated)."""
        tokens = take()
        self.reads += 1
        for col in range(tokens.shape[1]):
            column = tokens[:, col]
            self.new += 1
            yield column
            if self.eos:
                finished |= np.isin(column, self.eos)
                if finished.all():
                    return


def _eos_ids(model: Any, eos_token_id: Any) -> list[int]:
    if eos_token_id is FROM_CONFIG:
        eos_token_id = (getattr(model, "hf_config", None) or {}).get("eos_token_id")
    if eos_token_id is None:
        return []
    if isinstance(eos_token_id, int | np.integer):
        return [int(eos_token_id)]
    return [int(e) for e in eos_token_id]


def _device_of(model: Any) -> Any:
    for _, t in model.named_tensors():
        return t.device
    raise ValueError("generate: the model has no tensors")


__all__ = ["TOKEN_BLOCK", "GenerationMixin"]
