"""Activation checkpointing: a block's forward runs without a tape and is run again, with
one, when the backward reaches it (transformers' `gradient_checkpointing_enable`).

The trade: between the forward and the backward only each block's input stays alive, not
the block's intermediates (attention scores, MLP activations), at the cost of one more
forward of every block. On a lazy device this is a property of the recorded graph: the
intermediates of the first forward have no reader after it, so the planner frees them, and
the recomputation is recorded next to the block's gradient ops.

The block is one node on the tape; its backward records the recomputed forward and the
block's own backward (which accumulates into the block's parameters), and hands the
gradient of the input on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._autograd import _backward, enable_grad, enabled, link, no_grad
from .._tensor import Builder, Tensor
from ._layers import Dropout
from ._module import Module


@dataclass(frozen=True)
class _Recompute:
    """Stands where an op's declaration does on the tape (name, outputs, gradient rule)."""

    fn: Callable[..., Tensor]
    extra: tuple[Any, ...]
    name: str = "checkpoint"
    n_outputs: int = 1

    def grad(self, b: Any, g: Tensor, inputs: tuple, out: Tensor, attrs: dict) -> tuple:
        x = inputs[0].detach()
        x.requires_grad_(True)
        with enable_grad():
            y = self.fn(x, *self.extra)
            _backward(y, g, Builder)  # the block's parameters get their gradients here
        return (x.grad, *(None,) * (len(inputs) - 1))


def checkpoint(block: Module, x: Tensor, *extra: Any) -> Tensor:
    """`block(x, *extra)` whose intermediates are recomputed in the backward instead of kept.
    `extra` are tensors that need no gradient (RoPE tables, masks)."""
    params = tuple(t for _, t in block.named_parameters())
    if not enabled() or not (x.requires_grad or params):
        return block(x, *extra)
    for path, mod in block.named_modules():
        if isinstance(mod, Dropout) and mod.training and mod.p > 0:
            raise ValueError(
                f"gradient checkpointing: {path or 'the block'} drops out (p={mod.p}), and "
                "the recomputation would draw another mask; set its dropout to 0"
            )
    with no_grad():
        y = block(x, *extra)
    link(_Recompute(block, extra), (x, *params), {}, [y], None)  # type: ignore[arg-type]
    return y
