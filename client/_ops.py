"""Op dispatch: every op, built-in or composite, is recorded through `call`.

`call` binds attributes against the registry declaration, runs the shape rule (so errors
raise at the user's line), records a node on the device, and links autodiff when an input
needs gradients. Composites expand into primitives here, so every engine sees primitives only.
"""

from __future__ import annotations

from typing import Any

from burn_remote.protocol import dtypes
from burn_remote.protocol import ops as _ops
from burn_remote.protocol.graph import canonical_attrs
from burn_remote.protocol.registry import OPS, ShapeError

from . import _autograd
from ._recorder import Node, fmt_location, user_location
from ._tensor import Tensor, make_tensor

_ = _ops  # the declarations register on import


class RecordError(ValueError):
    """A shape or dtype rule refused an op at record time; names the user's line."""


def _device_of(name: str, inputs: tuple[Tensor, ...]):
    dev = inputs[0]._dev
    for t in inputs[1:]:
        if t._dev is not dev:
            raise RecordError(
                f"{name}: operands are on different devices ({dev} and {t._dev}); move one with .to()"
            )
    return dev


def call(name: str, *inputs: Tensor, _device: Any = None, _where: Any = None, **attrs: Any) -> Any:
    """Record op `name` on its operands' device and return its output tensor(s).

    This is the hot path of recording: it avoids generator expressions and does the common
    one-output case without loops.
    """
    op = OPS.get(name)
    if op is None:
        raise RecordError(f"unknown op {name!r}")
    for t in inputs:
        if type(t) is not Tensor:
            raise TypeError(f"{name}: expected Tensor operands, got {type(t).__name__}")
    try:
        bound = op.bind_attrs(attrs) if (attrs or op.attrs) else attrs
        if op.decompose is not None:
            builder = Builder(_device or _device_of(name, inputs), _where)
            return op.decompose(builder, *inputs, **bound)
        if op.arity is not None and len(inputs) != op.arity:
            raise ShapeError(f"{name}: expected {op.arity} operands, got {len(inputs)}")
        specs = op.infer(inputs, bound)
    except (ShapeError, TypeError) as exc:
        where = _where or user_location()
        raise RecordError(f"{exc} (at {fmt_location(where)})") from None
    if not inputs and _device is None:
        raise RecordError(
            f"{name}: an op with no tensor operands needs a device; use the device's methods "
            "(dev.full, dev.zeros, dev.uniform, ...)"
        )
    dev = _device if not inputs else _device_of(name, inputs)
    rec = dev._rec
    where = _where or user_location()
    key_attrs = canonical_attrs(bound) if bound else ()
    in_ids = tuple([t._id for t in inputs])
    if len(specs) == 1:
        shape, dtype = specs[0]
        if type(shape) is not tuple:
            shape = tuple(shape)
        tid = rec.new_id()
        rec.add(Node(name, in_ids, key_attrs, (tid,), ((shape, dtype),), where))
        outs = [make_tensor(dev, tid, shape, dtype)]
    else:
        specs = tuple([(tuple(s), d) for s, d in specs])
        ids = tuple([rec.new_id() for _ in specs])
        rec.add(Node(name, in_ids, key_attrs, ids, specs, where))
        outs = [make_tensor(dev, i, s, d) for i, (s, d) in zip(ids, specs)]
    if op.grad is not None and _autograd.enabled():
        for t in inputs:
            if t.requires_grad:
                _autograd.link(op, inputs, bound, outs, where)
                break
    return outs[0] if len(outs) == 1 else tuple(outs)


def const(dev: Any, value: float | int | bool, dtype: str, where: Any = None) -> Tensor:
    """A 0-d constant: its value is part of the graph's structure."""
    return call("full", _device=dev, _where=where, shape=(), value=value, dtype=dtype)


class Builder:
    """The recorder face that gradient rules and decompositions write against."""

    __slots__ = ("dev", "where")

    def __init__(self, dev: Any, where: Any = None) -> None:
        self.dev = dev
        self.where = where

    def op(self, name: str, *inputs: Tensor, **attrs: Any) -> Any:
        return call(name, *inputs, _device=self.dev, _where=self.where, **attrs)

    def const(self, value: float | int | bool, dtype: str) -> Tensor:
        return const(self.dev, value, dtype, self.where)


def operand(x: Any, like: Tensor) -> Tensor:
    """Turn a Python scalar into a constant of the weakly-typed dtype (NumPy 2 rules)."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, bool | int | float):
        return const(like._dev, x, dtypes.scalar_dtype(x, like.dtype))
    if type(x).__module__ == "numpy":  # NumPy scalars are weak like Python's; arrays upload
        return operand(x.item(), like) if x.ndim == 0 else like._dev.tensor(x)
    raise TypeError(f"unsupported operand type {type(x).__name__}")
