"""`export_decoder`: a causal LM as optimum exports decoders, with past_key_values.

One file serves the whole generation loop of a runtime that only runs files: the prompt
goes in with an empty past (P = 0), each later token with the presents of the call before.

    inputs   input_ids (B, S) int64, attention_mask (B, P + S) int64, position_ids (B, S)
             int64, past_key_values.{i}.key / .value (B, H_kv, P, D), i over the layers
    outputs  logits (B, S, vocab), present.{i}.key / .value (B, H_kv, P + S, D)

The dims are named as optimum names them: batch_size, sequence_length,
past_sequence_length and "past_sequence_length + sequence_length". The forward is the
model's own `forward_cached` over a `PastStep` (keys concatenated rather than written into
preallocated slots), so it computes what `generate` computes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from .._tensor import Tensor
from ..nn._module import Module
from ..nn._past_step import PastStep
from ..protocol import dtypes
from ._export import MAX_INLINE_BYTES, MIN_OPSET, save, to_onnx
from ._trace import ExportError

BATCH, SEQUENCE, PAST = "batch_size", "sequence_length", "past_sequence_length"
TOTAL = f"{PAST} + {SEQUENCE}"
EXAMPLE_SIZES = (2, 2, 3)
"""Batch, new tokens and past tokens of the traced example (each small and distinct)."""


def past_names(n_layer: int, stem: str = "past_key_values") -> list[str]:
    """`{stem}.{i}.key`, `{stem}.{i}.value` for each layer, in the file's order."""
    return [f"{stem}.{i}.{kv}" for i in range(n_layer) for kv in ("key", "value")]


class _WithPast(Module):
    """The traced function: (ids, mask, positions, *past) -> (logits, *presents)."""

    slots: Tensor
    """arange(context) on the model's device (a buffer; exported as an initializer)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.n_layer = model.cache_spec().n_layer
        slots = np.arange(model.cache_spec().max_positions, dtype=np.int64)
        self.register_buffer("slots", model.device.tensor(slots), persistent=False)

    def forward(self, ids: Tensor, mask: Tensor, positions: Tensor, *past: Tensor) -> Any:
        pairs = [(past[2 * i], past[2 * i + 1]) for i in range(self.n_layer)]
        step = PastStep(pairs, mask, positions, self.slots)
        return (self.model.forward_cached(ids, step), *step.present())


def export_decoder(
    model: Any,
    path: str | os.PathLike,
    *,
    opset: int = MIN_OPSET,
    max_inline_bytes: int = MAX_INLINE_BYTES,
) -> Path:
    """Export a causal LM (one with `cache_spec` and `forward_cached`: the GPT, the Llama
    family) with past_key_values inputs and present outputs (see the module docstring);
    checked with `onnx.checker` (full_check) as `export` does. Returns the path.

    Raises:
        ExportError: the model has no KV-cache forward, or an op cannot be exported.
    """
    if not callable(getattr(model, "forward_cached", None)):
        raise ExportError(
            f"export_decoder: {type(model).__name__} has no forward_cached (a causal LM with a "
            "KV cache: nn.GPT, nn.LlamaForCausalLM); use export for the no-cache forward"
        )
    spec = model.cache_spec()
    b, s, p = EXAMPLE_SIZES
    past_dtype = dtypes.to_numpy(spec.dtype)
    example = [
        np.zeros((b, s), np.int64),
        np.ones((b, p + s), np.int64),
        np.tile(np.arange(p, p + s, dtype=np.int64), (b, 1)),
        *[np.zeros((b, spec.n_kv_head, p, spec.head_dim), past_dtype)] * (2 * spec.n_layer),
    ]
    pasts = past_names(spec.n_layer)
    inputs = ["input_ids", "attention_mask", "position_ids", *pasts]
    axes: dict[Any, Any] = {
        "input_ids": {0: BATCH, 1: SEQUENCE},
        "attention_mask": {0: BATCH, 1: TOTAL},
        "position_ids": {0: BATCH, 1: SEQUENCE},
        **{name: {0: BATCH, 2: PAST} for name in pasts},
    }
    proto = to_onnx(
        _WithPast(model),
        tuple(example),
        input_names=inputs,
        output_names=["logits", *past_names(spec.n_layer, "present")],
        dynamic_axes=axes,
        opset=opset,
    )
    save(proto, path, max_inline_bytes)
    onnx.checker.check_model(str(path), full_check=True)
    return Path(path)


__all__ = ["export_decoder", "past_names"]
