"""Choosing the next token on the device: transformers' logits processors, then a draw.

Every function maps (B, vocab) float logits to the same on the device, so a decode step's
whole choice is part of its captured graph and the token never has to visit the client.
The order and the rules are transformers' (`generate` with do_sample): repetition penalty
(also when greedy), then temperature, top-k, top-p; a draw is Gumbel-max
(argmax(logits + g), g = -log(-log(u)), u from the `uniform` op under an explicit key),
which samples softmax(logits) exactly and gives the same tokens on every backend.

There is no sort op, so top-k and top-p walk the k largest distinct values with k unrolled
max passes (cost O(k * vocab) per step, hence MAX_TOP_K). Tokens tied on a logit are kept or
dropped together, where transformers' sort would cut between them in an order of its own.
"""

from __future__ import annotations

from .. import functional as F
from .._tensor import Tensor

MAX_TOP_K = 200
"""The largest top_k a step unrolls (each k adds three passes over the vocabulary)."""


def repetition_penalty(logits: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """transformers' RepetitionPenaltyLogitsProcessor: a token already in the sequence
    (`seen` (B, vocab) bool) has its logit divided by `penalty` (multiplied when negative)."""
    punished = F.where(logits < 0, logits * penalty, logits * (1.0 / penalty))
    return F.where(seen, punished, logits)


def top_k_top_p(logits: Tensor, top_k: int, top_p: float) -> Tensor:
    """`logits` with -inf outside the top_k largest (ties at the k-th kept, as transformers'
    TopKLogitsWarper) and then outside the smallest set whose probability reaches top_p
    (TopPLogitsWarper over what top-k left)."""
    k = min(top_k, logits.shape[-1])
    neg_inf = float("-inf")
    rest, threshold = logits, None
    levels: list[Tensor] = []
    for _ in range(k):
        level = rest.max(axis=-1, keepdims=True)  # the next largest distinct value
        levels.append(level)
        at_least = (logits >= level).cast("int32").sum(axis=-1, keepdims=True)
        reached = F.where(at_least >= k, level, neg_inf)
        threshold = reached if threshold is None else F.maximum(threshold, reached)
        rest = F.where(rest >= level, neg_inf, rest)
    assert threshold is not None
    kept = F.where(logits >= threshold, logits, neg_inf)
    if top_p >= 1.0:
        return kept
    probs = F.softmax(kept, axis=-1)
    cut = None
    for level in levels:
        above = F.where(kept > level, probs, 0.0).sum(axis=-1, keepdims=True)
        keep = (above < top_p) & (level >= threshold)
        candidate = F.where(keep, level, float("inf"))
        cut = candidate if cut is None else F.minimum(cut, candidate)
    return F.where(kept >= cut, kept, neg_inf)


def gumbel_argmax(logits: Tensor, key: Tensor) -> Tensor:
    """A draw from softmax(logits) per row (B,) int64: argmax(logits + Gumbel noise), the
    noise from `uniform` under `key` (a 0-d int64 tensor), identical on every backend."""
    u = logits.device.uniform(logits.shape, key)
    gumbel = -(-(u.log())).log()
    return (logits + gumbel).argmax(axis=-1)


__all__ = ["MAX_TOP_K", "gumbel_argmax", "repetition_penalty", "top_k_top_p"]
