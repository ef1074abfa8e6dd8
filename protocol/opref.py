"""The op reference (``protocol/OPS.md``), generated from the op registry.

``python -m burn_remote.protocol.opref > protocol/OPS.md`` rewrites it; a test checks that
the file matches the registry, so the page another implementation reads is the registry.
Dtype rules are found by asking each op's own shape rule about every dtype (nothing is
written twice); an op whose rule needs attributes without defaults, or operands of
particular shapes, points to its rule in the source instead.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from typing import Any

from . import ops  # noqa: F401  (declares every op)
from .dtypes import DTYPES, promote
from .extensions import parse_wire_name
from .registry import OPS, REQUIRED, OpDef

_PROBE_SHAPE = (2, 3)


@dataclass(frozen=True)
class _Operand:
    shape: tuple[int, ...]
    dtype: str


def _dtype_rule(op: OpDef) -> str:
    """'accepted input dtype -> output dtype' for operands all of one dtype, from the rule."""
    if any(v is REQUIRED for v in op.attrs.values()) or op.infer is None:
        return ""
    arity = 2 if op.arity is None else op.arity
    attrs = op.bind_attrs({})
    results: dict[str, str] = {}
    for dtype in DTYPES:
        try:
            specs = op.shapes([_Operand(_PROBE_SHAPE, dtype)] * arity, attrs)
        except Exception:  # the rule refuses this dtype (or these shapes)
            continue
        results[dtype] = ", ".join(d for _, d in specs)
    if not results:
        return ""
    if all(out == ", ".join([d] * op.n_outputs) for d, out in results.items()):
        return f"{', '.join(results)} (output: the input dtype)"
    groups: dict[str, list[str]] = {}
    for dtype, out in results.items():
        groups.setdefault(out, []).append(dtype)
    return "; ".join(f"{', '.join(ins)} -> {out}" for out, ins in groups.items())


def _rule_source(op: OpDef) -> str:
    fn = op.infer
    module = inspect.getmodule(fn)
    name = getattr(fn, "__qualname__", "?").split(".<locals>")[0]
    where = (module.__name__.rsplit(".", 1)[-1] + ".py") if module else "?"
    if name == "<lambda>":
        return f"(declared with the op in `protocol/{where}`)"
    return f"`{name}` in `protocol/{where}`"


def _promotion() -> list[str]:
    """The dtype of a binary op's output for each pair of operand dtypes."""
    head = "| | " + " | ".join(DTYPES) + " |"
    rows = [head, "|---" * (len(DTYPES) + 1) + "|"]
    for a in DTYPES:
        rows.append(f"| **{a}** | " + " | ".join(promote(a, b) for b in DTYPES) + " |")
    return rows


def _attr_row(name: str, default: Any) -> str:
    if default is REQUIRED:
        return f"| `{name}` | required | — |"
    kind = type(default).__name__ if default is not None else "any (None: unset)"
    return f"| `{name}` | {kind} | `{default!r}` |"


def _op(op: OpDef) -> list[str]:
    arity = "variadic (1 or more)" if op.arity is None else str(op.arity)
    lines = [f"### `{op.name}`", ""]
    if op.doc:
        lines += [op.doc, ""]
    lines += [
        f"- category: {op.category}; inputs: {arity}; outputs: {op.n_outputs}; "
        f"version: {op.version}"
    ]
    rule = _dtype_rule(op)
    if rule:
        lines.append(f"- dtypes (operands of one dtype): {rule}")
    else:
        lines.append(f"- dtypes and shapes: as its rule {_rule_source(op)} computes them")
    if op.attrs:
        lines += ["", "| attribute | type | default |", "|---|---|---|"]
        lines += [_attr_row(k, v) for k, v in op.attrs.items()]
    return [*lines, ""]


def render() -> str:
    """The whole page, deterministic (ops by category, then name)."""
    core = (op for op in OPS.values() if op.primitive and parse_wire_name(op.name) is None)
    prims = sorted(core, key=lambda o: (o.category, o.name))
    out = [
        "# Op reference (generated)",
        "",
        "Generated from the op registry by `python -m burn_remote.protocol.opref`; do not edit",
        "by hand (`tests/protocol/test_opref.py` checks it matches). These are the primitive",
        "ops a graph may contain (`protocol/README.md`, Graphs); composite ops are recorded as",
        "their primitives and never appear on the wire. A node's `attrs` must hold every",
        "attribute below (defaults filled in), sorted by name; its declared outputs must be",
        "what the op's rule gives for its inputs and attributes. Ops of extensions (wire name",
        "`extension.op@version`, named in Hello/Welcome `extensions`) are declared by their",
        "extension packages and follow the same rules; they are not listed here.",
        "",
        f"{len(prims)} primitive ops. Dtype names: {', '.join(DTYPES)}.",
        "",
        "Operands of two dtypes (binary, compare, select ops) meet at the promoted dtype",
        "(`protocol/dtypes.py` `promote`: bool < integers < floats, then width):",
        "",
        *_promotion(),
        "",
    ]
    category = None
    for op in prims:
        if op.category != category:
            category = op.category
            out += [f"## {category}", ""]
        out += _op(op)
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
