"""The ONNX lowering table and how entries join it, kept apart from the lowerings themselves.

Both lowering modules (`_lowering`: elementwise and reductions; `_lowering_movement_nn`:
movement, indexing and nn) register into this one table, and `_lowering` imports the other
so that importing it gives the whole table; this leaf is what keeps the two from importing
each other.
"""

from __future__ import annotations

from collections.abc import Callable

from ._emit import Emitter, Op

Lowering = Callable[[Emitter, Op], list[str]]
LOWERINGS: dict[str, Lowering] = {}

_BACKWARD = "backward-only: appears in gradient graphs, never in an inference graph"
NOT_EXPORTABLE: dict[str, str] = {
    "slice_backward": _BACKWARD,
    "index_add": _BACKWARD + " (the adjoint of index_select)",
    "conv2d_grad_input": _BACKWARD,
    "conv2d_grad_weight": _BACKWARD,
    "max_pool2d_backward": _BACKWARD,
    "avg_pool2d_backward": _BACKWARD,
    "adam_update": "optimizer update: training state, not part of a model",
    "sgd_update": "optimizer update: training state, not part of a model",
    "quantize_int8": "quantisation happens once when weights are loaded, not per inference; "
    "the exported graph dequantizes stored codes (dequantize_int8 is lowered)",
    "quantize_nf4": "quantisation happens once when weights are loaded, not per inference; "
    "the exported graph dequantizes stored codes (dequantize_nf4 is lowered)",
    "uniform": "randomness: the counter-based generator is for training (dropout, init); "
    "an exported model runs in eval mode, where no draw is recorded",
    "cross_entropy": "a training loss: an exported model ends at its outputs (logits)",
    "cross_entropy_backward": _BACKWARD,
    "all_reduce": "a collective across a device group (data-parallel training): an exported "
    "model runs on one device",
}


def lowers(*names: str) -> Callable[[Lowering], Lowering]:
    """Register the decorated function as the lowering of each op in ``names`` (once each)."""

    def register(fn: Lowering) -> Lowering:
        for name in names:
            if name in LOWERINGS:
                raise ValueError(f"ONNX lowering for {name!r} registered twice")
            LOWERINGS[name] = fn
        return fn

    return register


def cast_input(e: Emitter, n: Op, k: int, dtype: str) -> str:
    """Operand ``k`` of ``n`` cast to ``dtype`` (ONNX never promotes; the op's dtype wins)."""
    return e.cast(n.inputs[k], n.dtype(k), dtype)
