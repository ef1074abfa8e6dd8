"""The op reference (``protocol/OPS.md``), generated from the op registry.

``python -m burn_remote.protocol.opref > protocol/OPS.md`` rewrites it; a test checks that
the file matches the registry, so the page another implementation reads is the registry.
Dtype rules are found by asking each op's own shape rule about every dtype (nothing is
written twice). Each shape rule's docstring states the rule in the notation of the page's
"Shape rules" section (`inputs:`, `refused:`, `outputs:` lines); the page's table is those
docstrings, and tests/protocol/test_spec_shapes.py evaluates the table against the rules.
"""

from __future__ import annotations

import inspect
import re
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


SHAPE_NOTATION = (
    (
        "broadcast(s, t, ...)",
        "NumPy broadcasting: the shapes right-aligned, missing leading "
        "dims counting as 1; each output dim is the one size other than 1 on that axis (1 if all "
        "are 1). Refused when an axis has two different sizes, neither 1",
    ),
    ("promote(d, e, ...)", "the promotion table above, folded left to right"),
    (
        "norm_axis(a, n)",
        "an axis of an n-d tensor: refused unless -n <= a < max(n, 1); then "
        "a mod n (0 when n is 0)",
    ),
    (
        "norm_axes(v, n)",
        "None: (0, 1, ..., n - 1); an int a: norm_axes((a,), n); a list: each "
        "through norm_axis, sorted ascending; refused when two entries name the same axis",
    ),
    (
        "reduce(s, axes, keepdims)",
        "s with the dims at `axes` set to 1 (keepdims true) or removed (keepdims false)",
    ),
    ("numel(s)", "the product of the dims of s (1 for ())"),
    (
        "resolve(s, n)",
        "s with its -1, if any, replaced by n // numel(the other dims); refused "
        "when s holds more than one -1, or (with a -1) when numel(the other dims) is 0 or does "
        "not divide n",
    ),
    ("slice_len(a, o, t)", "the length of Python's range(a, o, t): max(0, ceil((o - a) / t))"),
    ("conv_out(n, k, s, p, d)", "floor((n + 2 p - d (k - 1) - 1) / s) + 1"),
    ("pair(v)", "(v, v) for an int v, else v (a pair of ints)"),
    (
        "conv_hw(x, k, stride, padding, dilation)",
        "(conv_out(x[2], k[0], S[0], P[0], D[0]), "
        "conv_out(x[3], k[1], S[1], P[1], D[1])) with S, P, D = pair(stride), pair(padding), "
        "pair(dilation)",
    ),
    (
        "pool_hw(x, kernel, stride, padding)",
        "conv_hw(x, pair(kernel), kernel if stride is None else stride, padding, 1)",
    ),
    (
        "is_float(d), is_int(d)",
        "d is float16, bfloat16, float32 or float64; d is int8, uint8, "
        "int32 or int64 (bool is neither)",
    ),
    ("sum_dtype(d)", "int64 for bool, int8, uint8 and int32; d otherwise"),
)
"""The helpers the shape table's expressions use: (call, meaning)."""

_RULE_FIELDS = ("inputs", "refused", "outputs")


def shape_rule(op: OpDef) -> dict[str, str]:
    """The op's rule as its shape rule's docstring states it: inputs, refused, outputs.

    Raises:
        ValueError: the rule's docstring does not state it (every primitive must).
    """
    doc = inspect.cleandoc(getattr(op.infer, "__doc__", None) or "")
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in doc.splitlines():
        key = re.match(r"(inputs|refused|outputs): (.*)", line)
        if key:
            current = found[key.group(1)] = [key.group(2)]
        elif current is not None and line.strip():
            current.append(line.strip())
    if "inputs" not in found or "outputs" not in found:
        raise ValueError(f"{op.name}: its shape rule's docstring states no inputs/outputs")
    rule = {k: " ".join(v).replace("( ", "(").replace(" )", ")") for k, v in found.items()}
    rule.setdefault("refused", "never")
    return rule


def _shape_rules(prims: list[OpDef]) -> list[str]:
    lines = [
        "## Shape rules",
        "",
        "What each op gives, written as Python expressions (so they can be read, and",
        "evaluated, without this implementation). In them an operand, named as in the",
        "`inputs` column, has `.shape` (a tuple of ints) and `.dtype` (a dtype name); an",
        "attribute is its name, its value as on the wire (arrays read as tuples); `cat`'s",
        "operands are the list `xs`. `outputs` is one `shape, dtype` pair, or for an op of",
        "several outputs one parenthesised pair each. Either cell may start with `name =",
        "expr;` bindings (those of `refused when` hold in `outputs`). A node is refused (`BAD_GRAPH`, protocol/README.md section 5) when its",
        "`refused when` expression is true, when a helper below refuses while either",
        "expression is evaluated, or when its declared outputs differ from the rule's (so a",
        "rule giving a dimension below 0, which no declaration can hold, is refused too).",
        "",
        "| helper | meaning |",
        "|---|---|",
        *(f"| `{call}` | {meaning} |" for call, meaning in SHAPE_NOTATION),
        "",
        "| op | inputs | refused when | outputs |",
        "|---|---|---|---|",
    ]
    for op in prims:
        rule = shape_rule(op)
        lines.append(f"| `{op.name}` | {rule['inputs']} | {rule['refused']} | {rule['outputs']} |")
    return [*lines, ""]


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
        lines.append("- dtypes and shapes: as its row of the Shape rules table gives them")
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
        *_shape_rules(sorted(prims, key=lambda o: o.name)),
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
