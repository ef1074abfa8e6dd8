"""The ONNX lowering table: one function per primitive op, keyed by the registry's op names.

A lowering gets the emitter and the node (`Op`: ONNX names of its operands, their specs, the
bound attributes) and returns the ONNX names of the op's outputs. Engine semantics win where
ONNX differs: operands are cast to the op's declared result dtype (ONNX never promotes),
integer division floors, softplus and logsumexp use their overflow-free forms. Ops that only
appear in training graphs are listed in NOT_EXPORTABLE with the reason; a test checks that
every primitive in the registry is in exactly one of the two.
"""

from __future__ import annotations

import numpy as np
from burn_remote.protocol import dtypes
from burn_remote.protocol.shapes import norm_axes

from . import _lowering_movement_nn  # noqa: F401  (registers movement, indexing, nn)
from ._emit import Emitter, Op
from ._lowering_table import LOWERINGS, NOT_EXPORTABLE, Lowering, lowers
from ._lowering_table import cast_input as _as

__all__ = ["LOWERINGS", "NOT_EXPORTABLE", "Lowering", "lowers"]


# --- elementwise ------------------------------------------------------------------------

_UNARY = {
    "neg": "Neg",
    "abs": "Abs",
    "sign": "Sign",
    "exp": "Exp",
    "log": "Log",
    "sqrt": "Sqrt",
    "sin": "Sin",
    "cos": "Cos",
    "tanh": "Tanh",
    "sigmoid": "Sigmoid",
    "relu": "Relu",
    "erf": "Erf",
}


def _unary(onnx_op: str) -> Lowering:
    return lambda e, n: [e.node(onnx_op, [n.inputs[0]])]


for _name, _onnx in _UNARY.items():
    lowers(_name)(_unary(_onnx))


@lowers("rsqrt")
def _rsqrt(e: Emitter, n: Op) -> list[str]:
    return [e.node("Reciprocal", [e.node("Sqrt", n.inputs)])]


@lowers("softplus")
def _softplus(e: Emitter, n: Op) -> list[str]:
    """max(x, 0) + log(1 + exp(-|x|)): never overflows, as the engine's kernel."""
    x = n.inputs[0]
    tail = e.node("Exp", [e.node("Neg", [e.node("Abs", [x])])])
    tail = e.node("Log", [e.node("Add", [tail, e.scalar(1, n.dtype())])])
    return [e.node("Add", [e.node("Relu", [x]), tail])]


@lowers("floor")
def _floor(e: Emitter, n: Op) -> list[str]:
    return [e.node("Floor", n.inputs) if dtypes.is_float(n.dtype()) else n.inputs[0]]


_BINARY = {
    "add": "Add",
    "sub": "Sub",
    "mul": "Mul",
    "pow": "Pow",
    "maximum": "Max",
    "minimum": "Min",
}
_BOOL_BINARY = {"add": "Or", "mul": "And", "maximum": "Or", "minimum": "And"}


def _binary(name: str) -> Lowering:
    def lower(e: Emitter, n: Op) -> list[str]:
        dt = n.out_dtype
        op = _BOOL_BINARY.get(name, _BINARY[name]) if dt == "bool" else _BINARY[name]
        return [e.node(op, [_as(e, n, 0, dt), _as(e, n, 1, dt)])]

    return lower


for _name in _BINARY:
    lowers(_name)(_binary(_name))


@lowers("div")
def _div(e: Emitter, n: Op) -> list[str]:
    """Integer division floors (NumPy's //); ONNX Div truncates, so divide a - (a mod b)."""
    dt = n.out_dtype
    a, b = _as(e, n, 0, dt), _as(e, n, 1, dt)
    if dtypes.is_float(dt):
        return [e.node("Div", [a, b])]
    exact = e.node("Sub", [a, e.node("Mod", [a, b], fmod=0)])
    return [e.node("Div", [exact, b])]


_COMPARE = {
    "eq": "Equal",
    "lt": "Less",
    "le": "LessOrEqual",
    "gt": "Greater",
    "ge": "GreaterOrEqual",
}


def _compare(name: str) -> Lowering:
    def lower(e: Emitter, n: Op) -> list[str]:
        dt = dtypes.promote(n.dtype(0), n.dtype(1))
        if dt == "bool" and name not in ("eq", "ne"):
            dt = "int8"  # ONNX orders numbers only
        a, b = _as(e, n, 0, dt), _as(e, n, 1, dt)
        if name == "ne":
            return [e.node("Not", [e.node("Equal", [a, b])])]
        return [e.node(_COMPARE[name], [a, b])]

    return lower


for _name in (*_COMPARE, "ne"):
    lowers(_name)(_compare(_name))


@lowers("logical_and", "logical_or", "logical_not")
def _logical(e: Emitter, n: Op) -> list[str]:
    op = {1: "Not"}.get(len(n.inputs))
    args = [_as(e, n, k, "bool") for k in range(len(n.inputs))]
    if op is None:
        op = "And" if n.name == "logical_and" else "Or"
    return [e.node(op, args)]


@lowers("where")
def _where(e: Emitter, n: Op) -> list[str]:
    dt = n.out_dtype
    return [e.node("Where", [n.inputs[0], _as(e, n, 1, dt), _as(e, n, 2, dt)])]


@lowers("cast")
def _cast(e: Emitter, n: Op) -> list[str]:
    return [e.cast(n.inputs[0], n.dtype(), n.out_dtype)]


@lowers("full")
def _full(e: Emitter, n: Op) -> list[str]:
    dt = n.out_dtype
    shape = n.attrs["shape"]
    value = np.asarray(n.attrs["value"]).astype(dtypes.to_numpy(dt))
    if not shape:
        return [e.const(value)]
    from onnx import numpy_helper

    fill = numpy_helper.from_array(value.reshape(1), "value")
    return [e.node("ConstantOfShape", [e.ints(shape)], value=fill)]


@lowers("value")
def _value(e: Emitter, n: Op) -> list[str]:
    """A bound scalar: the value it had when the model was traced becomes a constant."""
    return [e.scalar(n.value, n.out_dtype)]


# --- reductions and matmul --------------------------------------------------------------


def _axes(n: Op, key: str = "axes") -> tuple[int, ...]:
    return norm_axes(n.name, n.attrs[key], len(n.in_specs[0][0]))


def _reduce(onnx_op: str) -> Lowering:
    def lower(e: Emitter, n: Op) -> list[str]:
        x = _as(e, n, 0, n.out_dtype)
        axes = _axes(n)
        if not axes:
            return [x]
        keep = int(bool(n.attrs["keepdims"]))
        return [e.node(onnx_op, [x, e.ints(axes)], keepdims=keep)]

    return lower


lowers("sum")(_reduce("ReduceSum"))
lowers("max")(_reduce("ReduceMax"))
lowers("min")(_reduce("ReduceMin"))


@lowers("argmax", "argmin")
def _arg(e: Emitter, n: Op) -> list[str]:
    op = "ArgMax" if n.name == "argmax" else "ArgMin"
    x, ndim = n.inputs[0], len(n.in_specs[0][0])
    keep = int(bool(n.attrs["keepdims"]))
    if n.attrs["axis"] is None:
        flat = e.node("Reshape", [x, e.ints([-1])])
        r = e.node(op, [flat], axis=0, keepdims=0)
        return [e.node("Reshape", [r, e.ints([1] * ndim)]) if keep else r]
    return [e.node(op, [x], axis=int(n.attrs["axis"]) % max(ndim, 1), keepdims=keep)]


@lowers("logsumexp")
def _logsumexp(e: Emitter, n: Op) -> list[str]:
    """m + log(sum(exp(x - m))) with m the maximum: large inputs do not overflow."""
    x, axes = n.inputs[0], _axes(n)
    if not axes:
        return [x]
    ax = e.ints(axes)
    m = e.node("ReduceMax", [x, ax], keepdims=1)
    s = e.node("ReduceSum", [e.node("Exp", [e.node("Sub", [x, m])]), ax], keepdims=1)
    out = e.node("Add", [e.node("Log", [s]), m])
    return [out if n.attrs["keepdims"] else e.node("Squeeze", [out, ax])]


@lowers("softmax", "log_softmax")
def _softmax(e: Emitter, n: Op) -> list[str]:
    op = "Softmax" if n.name == "softmax" else "LogSoftmax"
    return [e.node(op, n.inputs, axis=int(n.attrs["axis"]))]


@lowers("matmul")
def _matmul(e: Emitter, n: Op) -> list[str]:
    dt = n.out_dtype
    return [e.node("MatMul", [_as(e, n, 0, dt), _as(e, n, 1, dt)])]
