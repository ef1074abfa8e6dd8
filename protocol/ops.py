"""All op declarations, imported once; category sets for passes that match on kinds of op."""

from __future__ import annotations

from . import (  # noqa: F401
    ops_collective,
    ops_elementwise,
    ops_movement,
    ops_nn,
    ops_optim,
    ops_reduce,
)
from .registry import OPS, OpDef, by_category, get

UNARY = by_category("unary")
BINARY = by_category("binary")
COMPARE = by_category("compare")
REDUCE = by_category("reduce")
MOVEMENT = by_category("movement")
COLLECTIVE = by_category("collective")
ELEMENTWISE = UNARY | BINARY | COMPARE | {"where", "cast"}
PRIMITIVES = frozenset(name for name, op in OPS.items() if op.primitive)
COMPOSITES = frozenset(OPS) - PRIMITIVES

__all__ = [
    "OPS",
    "OpDef",
    "get",
    "UNARY",
    "BINARY",
    "COMPARE",
    "REDUCE",
    "MOVEMENT",
    "COLLECTIVE",
    "ELEMENTWISE",
    "PRIMITIVES",
    "COMPOSITES",
]
