"""Reverse-mode autodiff on the client: backward records gradient ops into the pending graph.

Autodiff is on for any tensor that requires gradients (parameters do); `no_grad()` turns
recording of the tape off, as for an optimizer update. The forward, the backward and the
update therefore land in one graph, which the device runs at the next sync.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from burn_remote.protocol.registry import NotDifferentiable, OpDef

from ._recorder import fmt_location

_state = threading.local()


def enabled() -> bool:
    return getattr(_state, "grad", True)


@contextlib.contextmanager
def no_grad() -> Iterator[None]:
    """Ops recorded inside do not track gradients (optimizer updates, evaluation)."""
    prev = enabled()
    _state.grad = False
    try:
        yield
    finally:
        _state.grad = prev


@contextlib.contextmanager
def enable_grad() -> Iterator[None]:
    """Record the tape again inside a `no_grad` region (a recomputation during backward)."""
    prev = enabled()
    _state.grad = True
    try:
        yield
    finally:
        _state.grad = prev


class GradNode:
    """The tape entry of one op: its inputs (kept alive until backward) and its outputs."""

    __slots__ = ("op", "inputs", "versions", "attrs", "outputs", "where")

    def __init__(self, op: OpDef, inputs: tuple, attrs: dict, outputs: list, where: Any) -> None:
        self.op = op
        self.inputs: tuple[Any, ...] | None = inputs
        """The op's operands, kept alive for the rule; None once backward freed the tape."""
        self.versions = tuple([t._version for t in inputs])
        """The inputs' versions when recorded: an in-place update since then means the
        gradient would use the new value, so backward refuses (torch's version counter)."""
        self.attrs = attrs
        self.outputs = [weakref.ref(o) for o in outputs]
        self.where = where


def link(op: OpDef, inputs: tuple, attrs: dict, outputs: list, where: Any) -> None:
    """Put the op on the tape: its outputs require gradients and point back at it."""
    node = GradNode(op, inputs, attrs, outputs, where)
    for k, o in enumerate(outputs):
        o.requires_grad = True
        o._node = node
        o._out = k


def _topo(root: Any) -> list[GradNode]:
    order: list[GradNode] = []
    seen: set[int] = set()
    stack: list[tuple[GradNode, bool]] = [(root._node, False)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for t in node.inputs or ():
            if t._node is not None and id(t._node) not in seen:
                stack.append((t._node, False))
    return order


@contextlib.contextmanager
def backward_hook(hook: Any) -> Iterator[None]:
    """While active in this thread, every `backward` calls `hook.before(root)` first and
    `hook.after(root)` once the gradients are recorded. DataParallel reduces gradients across
    replicas this way, so they are averaged when `backward()` returns, as in PyTorch's DDP:
    clipping and the optimizer see the whole-batch gradient."""
    prev = getattr(_state, "hook", None)
    _state.hook = hook
    try:
        yield
    finally:
        _state.hook = prev


def backward(root: Any, grad: Any, builder: Callable[[Any, Any], Any]) -> None:
    """Record the gradient ops of everything ``root`` depends on; leaves get ``.grad``.

    ``builder(device, where)`` makes the recorder face that gradient rules write against
    (`_tensor.Builder`): the tape lives below the tensor, so the tensor hands it down."""
    hook = getattr(_state, "hook", None)
    if hook is None:
        _backward(root, grad, builder)
        return
    hook.before(root)
    _backward(root, grad, builder)
    hook.after(root)


def _backward(root: Any, grad: Any, builder: Callable[[Any, Any], Any]) -> None:
    if not root.requires_grad:
        raise RuntimeError("backward(): this tensor does not require gradients")
    if grad is None:
        if root.size != 1:
            raise RuntimeError(
                f"backward(): give a gradient for non-scalar output of shape {root.shape}"
            )
        grad = builder(root._dev, None).op("full", shape=root.shape, value=1.0, dtype=root.dtype)
    if root._node is None:  # a leaf
        _accumulate(root, grad)
        return
    order = _topo(root)
    grads: dict[int, list[Any]] = {id(root._node): [None] * len(root._node.outputs)}
    grads[id(root._node)][root._out] = grad
    with no_grad():
        for node in reversed(order):
            gouts = grads.pop(id(node), None)
            if gouts is None or all(g is None for g in gouts):
                continue
            if node.inputs is None:
                raise RuntimeError(
                    "backward(): trying to backward through the graph a second time (its "
                    "tape was freed by the first backward; recompute the forward)"
                )
            for t, v in zip(node.inputs, node.versions):
                if t._version != v:
                    raise RuntimeError(
                        f"backward(): a tensor the gradient of {node.op.name!r} (recorded at "
                        f"{fmt_location(node.where)}) needs was modified by an in-place "
                        "operation after it was used"
                    )
            rule = node.op.grad
            if isinstance(rule, NotDifferentiable) or rule is None:
                raise RuntimeError(
                    f"backward(): op {node.op.name!r} (recorded at {fmt_location(node.where)}) "
                    "is not differentiable"
                )
            out: Any
            g: Any
            if node.op.n_outputs > 1:  # multi-output rules see every output and its gradient
                out = tuple(o() for o in node.outputs)
                g = tuple(gouts)
            else:
                out = node.outputs[0]()
                g = gouts[0]
            face = builder(node.inputs[0]._dev if node.inputs else out._dev, node.where)
            gins = rule(face, g, node.inputs, out, node.attrs)
            for inp, gi in zip(node.inputs, gins):
                if gi is None or not inp.requires_grad:
                    continue
                if gi.dtype != inp.dtype:
                    gi = gi.cast(inp.dtype)
                if inp._node is None:
                    _accumulate(inp, gi)
                else:
                    slot = grads.setdefault(id(inp._node), [None] * len(inp._node.outputs))
                    slot[inp._out] = gi if slot[inp._out] is None else slot[inp._out] + gi
    for node in order:  # free the tape: activations die unless the user holds them
        node.inputs = None


def _accumulate(leaf: Any, g: Any) -> None:
    with no_grad():
        leaf.grad = g if leaf.grad is None else leaf.grad + g
