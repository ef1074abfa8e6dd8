"""The small ONNX graph builder that lowerings write against: nodes, constants, casts, shapes.

Lowerings never touch protobuf directly; they ask the emitter for nodes and constants by
value, so every lowering reads like the op's definition. Shape-like integer lists go through
`ints`, which is where a `Dyn` (a size that follows the batch) becomes a Shape-based
computation on the first model input.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from burn_remote.protocol import dtypes
from onnx import TensorProto, helper, numpy_helper

from ._trace import Dyn

ONNX_DTYPES = {
    "bool": TensorProto.BOOL,
    "int8": TensorProto.INT8,
    "uint8": TensorProto.UINT8,
    "int32": TensorProto.INT32,
    "int64": TensorProto.INT64,
    "float16": TensorProto.FLOAT16,
    "bfloat16": TensorProto.BFLOAT16,
    "float32": TensorProto.FLOAT,
    "float64": TensorProto.DOUBLE,
}

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


@dataclass(slots=True)
class Op:
    """One primitive node as a lowering sees it: ONNX names of its operands, specs, attrs."""

    name: str
    inputs: list[str]
    in_specs: list[tuple[tuple[Any, ...], str]]
    out_specs: list[tuple[tuple[Any, ...], str]]
    attrs: dict[str, Any]
    value: Any = None

    def dtype(self, k: int = 0) -> str:
        """Our dtype name of input ``k`` (the first by default): what a lowering casts from."""
        return self.in_specs[k][1]

    @property
    def out_dtype(self) -> str:
        """Our dtype name of the first output: what a lowering must produce (casting back if ONNX
        computed it in another type)."""
        return self.out_specs[0][1]


class Emitter:
    """Collects ONNX nodes and initializers; names are fresh and never collide."""

    def __init__(self, sources: dict[str, tuple[str, int]] | None = None) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.sources = sources or {}
        """Dynamic axis name -> (model input, axis) whose runtime size it is."""
        self._count = 0
        self._consts: dict[tuple, str] = {}
        self._symbols: dict[str, str] = {}
        self._dyn: dict[Any, str] = {}
        self._names: set[str] = set()

    def fresh(self, hint: str) -> str:
        """A new value name ``<hint>_<n>``, never one already used or reserved: node outputs never
        collide with the graph's inputs, outputs or initializers."""
        while True:
            self._count += 1
            name = f"{hint}_{self._count}"
            if name not in self._names:
                self._names.add(name)
                return name

    def reserve(self, name: str) -> None:
        """Mark ``name`` as taken (a model input or output named by the user), so `fresh` never
        hands it out."""
        self._names.add(name)

    def node(
        self, op_type: str, inputs: Sequence[str], n_out: int = 1, out: str | None = None, **attrs
    ) -> Any:
        """Add a node; returns its output name (a list of names when n_out > 1)."""
        outs = [out] if out is not None else [self.fresh(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(
            helper.make_node(op_type, list(inputs), outs, name=self.fresh(f"n_{op_type}"), **attrs)
        )
        return outs[0] if n_out == 1 else outs

    def initializer(self, name: str, array: np.ndarray) -> str:
        """Add ``array`` as an initializer (a stored tensor of the model) under ``name`` exactly, and
        return the name; use `const` for anonymous constants, which it shares by value."""
        self.reserve(name)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def const(self, array: Any, dtype: str | None = None) -> str:
        """A constant tensor (an initializer); small ones are shared by value."""
        arr = np.asarray(array, dtype=dtypes.to_numpy(dtype) if dtype else None)
        key = (arr.dtype.str, arr.shape, arr.tobytes()) if arr.size <= 64 else None
        if key is not None and key in self._consts:
            return self._consts[key]
        name = self.initializer(self.fresh("const"), arr)
        if key is not None:
            self._consts[key] = name
        return name

    def scalar(self, value: Any, dtype: str) -> str:
        """A 0-d constant ``value`` of our ``dtype``, shared with any equal one; returns its name."""
        return self.const(np.asarray(value, dtype=dtypes.to_numpy(dtype)))

    def cast(self, name: str, src: str, dst: str) -> str:
        """``name`` cast from our dtype ``src`` to ``dst`` (a Cast node), or ``name`` itself when
        they are the same: no node is emitted for a no-op cast."""
        if src == dst:
            return name
        return self.node("Cast", [name], to=ONNX_DTYPES[dst])

    def symbol(self, name: str) -> str:
        """A 1-element int64 tensor holding the runtime size of dynamic axis `name`."""
        if name not in self._symbols:
            if name not in self.sources:
                raise RuntimeError(f"a size that follows {name!r} needs that dynamic input axis")
            source, axis = self.sources[name]
            self._symbols[name] = self.node("Shape", [source], start=axis, end=axis + 1)
        return self._symbols[name]

    def _dyn_piece(self, d: Dyn) -> str:
        """sum of coef * product of symbols, as a 1-element int64 tensor."""
        if d.terms not in self._dyn:
            total = None
            for symbols, coef in d.terms:
                x = None
                for name in symbols:
                    x = self.symbol(name) if x is None else self.node("Mul", [x, self.symbol(name)])
                if x is None:
                    x = self.const(np.array([coef], np.int64))
                elif coef != 1:
                    x = self.node("Mul", [x, self.const(np.array([coef], np.int64))])
                total = x if total is None else self.node("Add", [total, x])
            assert total is not None, "a Dyn has a term (one that has none is a constant)"
            self._dyn[d.terms] = total
        return self._dyn[d.terms]

    def ints(self, values: Sequence[Any]) -> str:
        """A 1-d int64 tensor of `values`; `Dyn` entries are computed from the batch size."""
        values = list(values)
        if not any(isinstance(v, Dyn) for v in values):
            return self.const(np.array(values, dtype=np.int64).reshape(len(values)))
        pieces: list[str] = []
        run: list[int] = []
        for v in values:
            if isinstance(v, Dyn):
                if run:
                    pieces.append(self.const(np.array(run, dtype=np.int64)))
                    run = []
                pieces.append(self._dyn_piece(v))
            else:
                run.append(int(v))
        if run:
            pieces.append(self.const(np.array(run, dtype=np.int64)))
        return pieces[0] if len(pieces) == 1 else self.node("Concat", pieces, axis=0)


def static(values: Sequence[Any], where: str) -> list[int]:
    """Integers that become ONNX attributes: they cannot follow the batch size."""
    out = []
    for v in values:
        if isinstance(v, Dyn):
            raise ValueError(f"{where}: a size that follows a dynamic axis cannot be an attribute")
        out.append(int(v))
    return out
