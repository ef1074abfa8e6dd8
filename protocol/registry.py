"""The op registry: every op is declared here once, and both ends read the declarations.

A declaration carries the op's name, its attributes with defaults, a shape/dtype rule and a
gradient rule (or a decomposition into other ops). The client records and differentiates
through it, the server validates registered graphs against it, the engines look kernels up
by its names and the ONNX exporter lowers through it. Nothing here imports the client:
gradient rules and decompositions are written against a small builder interface (below).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

REQUIRED: Any = object()
"""Default of an attribute that every call must give."""


class NotDifferentiable:
    """Gradient marker for ops that have inputs a user may want gradients for, but no rule."""

    def __repr__(self) -> str:
        return "NOT_DIFFERENTIABLE"


NOT_DIFFERENTIABLE: Any = NotDifferentiable()


class ShapeError(ValueError):
    """A shape or dtype rule refused its operands; raised at record time."""


class Handle(Protocol):
    """What gradient rules and decompositions see of a tensor: a shape, a dtype, operators."""

    shape: tuple[int, ...]
    dtype: str

    def __add__(self, other: Any) -> Handle: ...
    def __sub__(self, other: Any) -> Handle: ...
    def __mul__(self, other: Any) -> Handle: ...
    def __truediv__(self, other: Any) -> Handle: ...
    def __neg__(self) -> Handle: ...
    def __rsub__(self, other: Any) -> Handle: ...
    def __rmul__(self, other: Any) -> Handle: ...
    def __radd__(self, other: Any) -> Handle: ...


class Shaped(Protocol):
    """What a shape rule sees of an operand: its shape and dtype (a tensor, or a bare spec
    such as an engine's)."""

    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...


class Builder(Protocol):
    """Records ops: the client passes one to gradient rules and decompositions."""

    def op(self, name: str, *inputs: Handle, **attrs: Any) -> Any: ...

    def const(self, value: float | int | bool, dtype: str) -> Handle: ...


Spec = tuple[tuple[int, ...], str]
InferRule = Callable[[Sequence[Shaped], Mapping[str, Any]], list[Spec]]
# A gradient rule gets (builder, g, inputs, out, attrs). For an op with n_outputs > 1, `g` and
# `out` are tuples with one entry per output (None where that output got no gradient, or where
# the output tensor is gone), so the rule should rebuild what it needs from the inputs.
GradRule = Callable[[Builder, Handle, Sequence[Handle], Handle, Mapping[str, Any]], Sequence[Any]]
Decomposition = Callable[..., Any]


@dataclass(frozen=True, eq=False)
class OpDef:
    """One op. `arity` None means variadic (cat); `decompose` set means a composite op."""

    name: str
    category: str
    arity: int | None
    attrs: Mapping[str, Any] = field(default_factory=dict)
    infer: InferRule | None = None
    grad: GradRule | None | NotDifferentiable = None
    decompose: Decomposition | None = None
    n_outputs: int = 1
    version: str = "1"
    doc: str = ""

    @property
    def primitive(self) -> bool:
        """True for an op engines implement as a kernel (it has a shape rule); False for a
        composite op, defined by its decomposition into other ops."""
        return self.decompose is None

    def shapes(self, inputs: Sequence[Shaped], attrs: Mapping[str, Any]) -> list[Spec]:
        """The result specs of the op on ``inputs`` (its shape rule).

        Raises:
            TypeError: the op declares no shape rule (a composite: it expands instead).
        """
        if self.infer is None:
            raise TypeError(f"{self.name}: a composite op has no shape rule of its own")
        return self.infer(inputs, attrs)

    def bind_attrs(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Fill defaults and refuse unknown or missing attributes, naming them."""
        unknown = set(given) - set(self.attrs)
        if unknown:
            raise TypeError(
                f"{self.name}: unknown attribute(s) {', '.join(sorted(unknown))}; "
                f"expected {', '.join(self.attrs) or 'none'}"
            )
        out = {}
        for key, default in self.attrs.items():
            if key in given:
                out[key] = given[key]
            elif default is REQUIRED:
                raise TypeError(f"{self.name}: missing attribute {key!r}")
            else:
                out[key] = default
        return out


OPS: dict[str, OpDef] = {}


def declare(
    name: str,
    category: str,
    arity: int | None,
    *,
    attrs: Mapping[str, Any] | None = None,
    infer: InferRule | None = None,
    grad: GradRule | None | NotDifferentiable = None,
    decompose: Decomposition | None = None,
    n_outputs: int = 1,
    version: str = "1",
    doc: str = "",
) -> OpDef:
    """Add an op to the registry; a name can be declared once only."""
    if name in OPS:
        raise ValueError(f"op {name!r} is already declared")
    if (infer is None) == (decompose is None):
        raise ValueError(f"op {name!r}: give exactly one of infer (primitive) or decompose")
    op = OpDef(
        name=name,
        category=category,
        arity=arity,
        attrs=dict(attrs or {}),
        infer=infer,
        grad=grad,
        decompose=decompose,
        n_outputs=n_outputs,
        version=version,
        doc=doc,
    )
    OPS[name] = op
    return op


def get(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}") from None


def by_category(category: str) -> frozenset[str]:
    return frozenset(name for name, op in OPS.items() if op.category == category)
