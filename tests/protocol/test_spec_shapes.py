"""protocol/OPS.md's shape rules, evaluated as written, agree with the op registry's.

Everything the oracle knows comes from the page: the promotion table, the helper table's
meanings (implemented below from their text, not imported) and each op's row of the Shape
rules table, whose `refused when` and `outputs` cells are evaluated as the page says. For
generated operands and attributes, the registry's rule (what the server's graph validation
runs) must accept exactly what the row accepts, giving the same outputs. A wrong cell, a
wrong helper text or a wrong rule in the code fails here.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from burn_remote.protocol import ops  # noqa: F401  (declares every op)
from burn_remote.protocol.graph import Graph, GraphError, GraphNode, validate
from burn_remote.protocol.registry import OPS, REQUIRED, ShapeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

PAGE = (Path(__file__).resolve().parents[2] / "protocol" / "OPS.md").read_text()
REFUSALS = (ShapeError, TypeError, ValueError, KeyError, IndexError)
"""What the server's graph validation turns into BAD_GRAPH (protocol/graph.py validate)."""


# --- the page, read ---------------------------------------------------------------------
def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _table(head: str) -> list[str]:
    """The rows of the table under ``head``, up to the blank line that ends it."""
    rows = PAGE[PAGE.index(head) :].split("\n\n", 1)[0].splitlines()
    return rows[2:]


DTYPES = tuple(re.search(r"Dtype names: ([a-z0-9, ]+)\.", PAGE).group(1).split(", "))  # type: ignore[union-attr]
PROMOTION = {
    (row[0].strip("*"), col): out
    for line in PAGE.splitlines()
    if line.startswith("| **")
    for row in [_cells(line)]
    for col, out in zip(DTYPES, row[1:])
}
RULES = {
    row[0].strip("`"): {
        "inputs": row[1],
        "refused": row[2].strip("`"),
        "outputs": row[3].strip("`"),
    }
    for line in _table("| op | inputs | refused when | outputs |")
    for row in [_cells(line)]
}
HELPERS = {
    helper
    for line in _table("| helper | meaning |")
    for helper in re.findall(r"(\w+)\(", _cells(line)[0])
}


# --- the helper table's meanings, implemented from their text ---------------------------
class Refused(Exception):
    """A helper refused its arguments: the node is refused."""


def broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    ndim = max(len(s) for s in shapes)
    padded = [(1,) * (ndim - len(s)) + tuple(s) for s in shapes]
    out = []
    for sizes in zip(*padded):
        others = {d for d in sizes if d != 1}
        if len(others) > 1:
            raise Refused("broadcast")
        out.append(others.pop() if others else 1)
    return tuple(out)


def promote(*names: str) -> str:
    out = names[0]
    for name in names[1:]:
        out = PROMOTION[(out, name)]
    return out


def norm_axis(a: int, n: int) -> int:
    if not -n <= a < max(n, 1):
        raise Refused("axis")
    return a % n if n else 0


def norm_axes(v: Any, n: int) -> tuple[int, ...]:
    if v is None:
        return tuple(range(n))
    if isinstance(v, int):
        return norm_axes((v,), n)
    out = [norm_axis(a, n) for a in v]
    if len(set(out)) != len(out):
        raise Refused("repeated axis")
    return tuple(sorted(out))


def reduce(s: tuple[int, ...], axes: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(s))
    return tuple(d for i, d in enumerate(s) if i not in axes)


def numel(s: Any) -> int:
    return math.prod(s)


def resolve(s: tuple[int, ...], n: int) -> tuple[int, ...]:
    if s.count(-1) > 1:
        raise Refused("two -1")
    if -1 not in s:
        return tuple(s)
    rest = numel(d for d in s if d != -1)
    if rest == 0 or n % rest:
        raise Refused("-1 unresolvable")
    return tuple(n // rest if d == -1 else d for d in s)


def slice_len(a: int, o: int, t: int) -> int:
    return max(0, math.ceil((o - a) / t))


def conv_out(n: int, k: int, s: int, p: int, d: int) -> int:
    return math.floor((n + 2 * p - d * (k - 1) - 1) / s) + 1


def pair(v: Any) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)  # type: ignore[return-value]


def conv_hw(x: tuple[int, ...], k: Any, stride: Any, padding: Any, dilation: Any) -> tuple:
    S, P, D = pair(stride), pair(padding), pair(dilation)
    return tuple(conv_out(x[2 + i], k[i], S[i], P[i], D[i]) for i in (0, 1))


def pool_hw(x: tuple[int, ...], kernel: Any, stride: Any, padding: Any) -> tuple:
    return conv_hw(x, pair(kernel), kernel if stride is None else stride, padding, 1)


def is_float(d: str) -> bool:
    return d in ("float16", "bfloat16", "float32", "float64")


def is_int(d: str) -> bool:
    return d in ("int8", "uint8", "int32", "int64")


def sum_dtype(d: str) -> str:
    return "int64" if d in ("bool", "int8", "uint8", "int32") else d


NOTATION = {
    f.__name__: f
    for f in (broadcast, promote, norm_axis, norm_axes, reduce, numel, resolve, slice_len)
    + (conv_out, pair, conv_hw, pool_hw, is_float, is_int, sum_dtype)
}


def test_every_helper_of_the_page_is_implemented_here_and_every_op_has_a_row() -> None:
    assert set(NOTATION) == HELPERS
    primitives = {n for n, op in OPS.items() if op.primitive and "@" not in n}
    assert set(RULES) == primitives


# --- evaluating a row ---------------------------------------------------------------------
Spec = tuple[tuple[int, ...], str]


def _evaluate(cell: str, scope: dict[str, Any]) -> Any:
    """A cell's `name = expr;` bindings (added to ``scope``), then its expression's value."""
    *bindings, expression = cell.split("; ")
    for binding in bindings:
        target, expr = binding.split(" = ", 1)
        scope[target] = eval(expr, scope)
    return eval(expression, scope)


def spec_rule(name: str, operands: list[Spec], attrs: dict[str, Any]) -> list[Spec] | None:
    """What the page's row gives: the outputs, or None when the node is refused."""
    rule = RULES[name]
    scope: dict[str, Any] = {**NOTATION, **attrs}
    views = [SimpleNamespace(shape=s, dtype=d) for s, d in operands]
    if rule["inputs"].startswith("xs"):
        scope["xs"] = views
    elif rule["inputs"] != "(none)":
        names = rule["inputs"].split(", ")
        assert len(names) == len(views), name
        scope.update(zip(names, views))
    try:
        if rule["refused"] != "never" and _evaluate(rule["refused"], scope):
            return None
        result = _evaluate(rule["outputs"], scope)
    except Refused:
        return None
    specs = [result] if OPS[name].n_outputs == 1 else list(result)
    specs = [(tuple(s), d) for s, d in specs]
    return None if any(d < 0 for s, _ in specs for d in s) else specs


def registry_rule(name: str, operands: list[Spec], attrs: dict[str, Any]) -> list[Spec] | None:
    """What the code's rule gives, refusals counted as graph validation counts them."""
    op = OPS[name]
    views = [SimpleNamespace(shape=s, dtype=d) for s, d in operands]
    try:
        specs = [(tuple(s), d) for s, d in op.shapes(views, op.bind_attrs(attrs))]
    except REFUSALS:
        return None
    return None if any(d < 0 for s, _ in specs for d in s) else specs


def validates(name: str, operands: list[Spec], attrs: dict[str, Any], outs: list[Spec]) -> bool:
    """Whether the server's graph validation takes a one-node graph declaring ``outs``."""
    node = GraphNode(name, tuple(range(len(operands))), tuple(sorted(attrs.items())), tuple(outs))
    try:
        validate(Graph(tuple(operands), (node,), (len(operands),)))
    except GraphError:
        return False
    return True


# --- generated cases ----------------------------------------------------------------------
dims = st.integers(0, 4)
small = st.integers(-3, 5)


@st.composite
def _shape_like(draw: st.DrawFn, base: tuple[int, ...]) -> tuple[int, ...]:
    """A shape near ``base``: itself, leading dims dropped, some dims 1, or anything."""
    how = draw(st.sampled_from(["same", "drop", "ones", "any"]))
    if how == "same":
        return base
    if how == "drop":
        return base[draw(st.integers(0, len(base))) :]
    if how == "ones":
        return tuple(1 if draw(st.booleans()) else d for d in base)
    return tuple(draw(st.lists(dims, max_size=4)))


def _int_tuple(n: int, values: st.SearchStrategy[int] = small) -> st.SearchStrategy:
    return st.one_of(st.tuples(*[values] * n), st.lists(values, max_size=5).map(tuple))


def _attr(data: st.DataObject, op: str, key: str, default: Any, base: tuple[int, ...]) -> Any:
    """A value for attribute ``key``: often a sensible one for ``base``, sometimes not."""
    n = len(base)
    if default is REQUIRED and key == "value":
        return 1.5
    if key in ("dtype",):
        return data.draw(st.sampled_from(DTYPES))
    if key in ("keepdims", "nesterov", "decoupled"):
        return data.draw(st.booleans())
    if key == "axes":
        return data.draw(st.one_of(st.none(), small, _int_tuple(min(n, 2))))
    if key == "axis":
        none = st.none() if default is None else st.nothing()
        return data.draw(st.one_of(none, st.integers(-n - 1, n)))
    if key == "shape" and op == "reshape":
        return tuple(data.draw(st.permutations(base)) if data.draw(st.booleans()) else ()) or (
            data.draw(_int_tuple(n, st.integers(-1, 6)))
        )
    if key in ("input_shape", "weight_shape") and data.draw(st.integers(0, 2)):
        return base  # a conv or pool gradient's forward operand: most often the one given
    if key in ("shape", "in_shape", "input_shape", "weight_shape"):
        return data.draw(st.one_of(st.just(base), _shape_like(base), _int_tuple(n, small)))
    if key == "dims":
        perm = data.draw(st.permutations(range(n)))
        return (
            tuple(data.draw(st.sampled_from([d, d - n])) for d in perm)
            if data.draw(st.booleans())
            else data.draw(_int_tuple(n, st.integers(-n - 1, n)))
        )
    if key in ("starts", "stops", "steps"):
        values = st.integers(-2, 6) if key != "steps" else st.sampled_from([1, 1, 2, -1, 0, 3])
        return data.draw(_int_tuple(n, values))
    if key == "pads":
        return tuple(data.draw(st.lists(st.tuples(small, small), min_size=n, max_size=n + 1)))
    if key in ("stride", "padding", "dilation", "kernel"):
        if key == "stride" and default is None and data.draw(st.booleans()):
            return None
        if key == "padding":
            return data.draw(st.sampled_from([0, 0, 0, 1, (0, 1), (1, 0), -1, (0, -1)]))
        return data.draw(st.sampled_from([1, 1, 1, 2, (1, 2), (2, 1), 3, 0, -1, (1, 0)]))
    if key == "groups":
        return data.draw(st.sampled_from([1, 1, 1, 2, 3, 0]))
    if key in ("num_classes", "size"):
        return data.draw(st.integers(-1, 5))
    if key == "block":
        return data.draw(st.sampled_from([64, 1, 2, 3, 4, 0, -2]))
    if key == "label_smoothing":
        return data.draw(st.sampled_from([0.0, 0.1, 0.99, 1.0, -0.5]))
    if key == "op":
        return data.draw(st.sampled_from(["sum", "mean", "max"]))
    if key == "group":
        return data.draw(st.sampled_from([1, 7, 2**64 - 1, 0, -1, 2**64, True]))
    return default  # a value the rule does not read (value, ignore_index, eps, ...)


def _operands(data: st.DataObject, name: str, base: tuple[int, ...]) -> list[Spec]:
    arity = OPS[name].arity
    n = data.draw(st.integers(1, 3)) if arity is None else arity
    if name in FOUR_D and data.draw(st.integers(0, 3)):
        base = tuple(data.draw(st.lists(st.integers(1, 5), min_size=4, max_size=4)))
    shapes = [base, *(data.draw(_shape_like(base)) for _ in range(n - 1))][:n]
    if name in ("conv2d", "conv2d_grad_input") and len(base) == 4 and data.draw(st.integers(0, 3)):
        kernel = data.draw(st.tuples(st.integers(1, 3), st.integers(1, 3)))
        shapes[1] = (data.draw(st.integers(1, 4)), base[1], *kernel)
    if name == "uniform" and data.draw(st.booleans()):
        return [((), data.draw(st.sampled_from(["int64", "int32", "uint8"])))]
    if name == "cross_entropy" and base and data.draw(st.booleans()):
        return [(base, "float32"), (base[:-1], data.draw(st.sampled_from(["int64", "int32"])))]
    if name in ("adam_update", "sgd_update"):
        scalars = 3 if name == "adam_update" else 1
        shapes = shapes[: n - scalars] + [data.draw(st.sampled_from([(), (1,)]))] * scalars
    common = data.draw(st.sampled_from(DTYPES))
    return [
        (s, common if data.draw(st.integers(0, 3)) else data.draw(st.sampled_from(DTYPES)))
        for s in shapes
    ]


FOUR_D = ("conv2d", "max_pool2d", "avg_pool2d", "conv2d_grad_input", "conv2d_grad_weight",
          "max_pool2d_backward", "avg_pool2d_backward")  # fmt: skip


def _forward(name: str, operands: list[Spec], attrs: dict[str, Any]) -> tuple[str, list[Spec]]:
    """A backward op's forward and the forward's operands, as the page's rows relate them
    (the gradient operand is what the forward outputs)."""
    attrs_x = lambda key: [(tuple(attrs[key]), operands[0][1])]  # noqa: E731
    return {
        "slice_backward": lambda: ("slice", attrs_x("in_shape")),
        "avg_pool2d_backward": lambda: ("avg_pool2d", attrs_x("input_shape")),
        "max_pool2d_backward": lambda: ("max_pool2d", operands[:1]),
        "conv2d_grad_input": lambda: ("conv2d", attrs_x("input_shape") + operands[1:]),
        "conv2d_grad_weight": lambda: (
            "conv2d", operands[:1] + [(tuple(attrs["weight_shape"]), operands[0][1])]
        ),
    }[name]()  # fmt: skip


GRADIENT_AT = {"slice_backward": 0, "avg_pool2d_backward": 0, "max_pool2d_backward": 1,
               "conv2d_grad_input": 0, "conv2d_grad_weight": 1}  # fmt: skip
"""Where a backward op takes the gradient of its forward's output."""


def _with_consistent_gradient(name: str, operands: list[Spec], attrs: dict[str, Any]) -> list[Spec]:
    """The operands with the gradient given the shape the page's forward row makes (when
    that forward is accepted), so that backward rows are reached past their refusal."""
    forward, forward_operands = _forward(name, operands, attrs)
    try:
        made = spec_rule(forward, forward_operands, attrs)
    except (KeyError, TypeError, IndexError):
        return operands
    if made is None:
        return operands
    at = GRADIENT_AT[name]
    return [*operands[:at], (made[0][0], operands[at][1]), *operands[at + 1 :]]


PRIMITIVES = sorted(RULES)


@pytest.mark.parametrize("name", PRIMITIVES)
def test_the_page_s_shape_rule_is_the_registry_s(name: str) -> None:
    seen: Counter[str] = Counter()

    @settings(
        max_examples=100,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def check(data: st.DataObject) -> None:
        base = tuple(data.draw(st.lists(dims, max_size=4)))
        operands = _operands(data, name, base)
        if name in FOUR_D:
            base = operands[0][0]  # a backward op's input_shape/weight_shape near it
        attrs = {k: _attr(data, name, k, v, base) for k, v in OPS[name].attrs.items()}
        if name.startswith("quantize") and data.draw(st.booleans()):
            operands = [(data.draw(st.sampled_from([(4, 16), (2, 64), (8,)])), "float32")]
        if name.startswith("dequantize") and attrs["block"] > 0 and data.draw(st.booleans()):
            n, per_byte = numel(attrs["shape"]), 2 if name.endswith("nf4") else 1
            operands = [((n // per_byte,), "uint8"), ((n // attrs["block"],), "float32")]
        if name in GRADIENT_AT and data.draw(st.integers(0, 3)):
            operands = _with_consistent_gradient(name, operands, attrs)
        want = spec_rule(name, operands, attrs)
        got = registry_rule(name, operands, attrs)
        assert got == want, (operands, attrs)
        if want is not None:
            assert validates(name, operands, attrs, want)
        seen["accepted" if want is not None else "refused"] += 1

    check()
    assert seen["accepted"] >= 5, seen  # the generated cases reach the rule's outputs
    if RULES[name]["refused"] != "never":
        assert seen["refused"] >= 1, seen


@pytest.mark.parametrize(
    ("name", "operands", "attrs"),
    [
        ("conv2d", [((1, 1, 1, 1), "float32")] * 2, {"stride": -1}),  # accepted before
        ("conv2d", [((1, 0, 3, 3), "float32"), ((1, 0, 3, 3), "float32")], {"groups": 0}),
        ("max_pool2d", [((1, 1, 4, 4), "float32")], {"kernel": 2, "stride": 0}),
        ("max_pool2d", [((1, 1, 1, 1), "float32")], {"kernel": 1, "stride": -1}),
        ("dequantize_int8", [((4,), "int8"), ((1,), "float32")], {"block": 0, "shape": (4,)}),
        # gradients that are not their forward's output (a device kernel sized from the
        # attributes would read past them): accepted before
        ("slice", [((2, 3), "float32")], {"starts": (0, 0), "stops": (9, 3), "steps": (1, 1)}),
        ("slice_backward", [((2, 3), "float32")],
         {"in_shape": (2, 3), "starts": (0, 0), "stops": (1, 3), "steps": (1, 1)}),
        ("avg_pool2d_backward", [((1, 1, 4, 4), "float32")],
         {"kernel": 2, "input_shape": (1, 1, 4, 4)}),
        ("max_pool2d_backward", [((1, 1, 4, 4), "float32"), ((1, 1, 3, 3), "float32")],
         {"kernel": 2}),
        ("conv2d_grad_input", [((1, 2, 4, 4), "float32"), ((2, 1, 3, 3), "float32")],
         {"input_shape": (1, 1, 4, 4)}),
        ("conv2d_grad_weight", [((1, 1, 4, 4), "float32"), ((1, 2, 4, 4), "float32")],
         {"weight_shape": (2, 1, 3, 3)}),
    ],
    ids=["conv-negative-stride", "conv-groups-0", "pool-stride-0", "pool-negative-stride",
         "dequantize-block-0", "slice-past-the-axis", "slice-backward-larger-gradient",
         "avg-pool-backward-gradient", "max-pool-backward-gradient", "conv-grad-input-gradient",
         "conv-grad-weight-gradient"],
)  # fmt: skip
def test_attributes_a_kernel_cannot_run_are_refused_by_both(
    name: str, operands: list[Spec], attrs: dict[str, Any]
) -> None:
    """Strides, groups and blocks below 1 were accepted (a kernel with a negative stride) or
    crashed graph validation with ZeroDivisionError instead of BAD_GRAPH; slice bounds past
    an axis and gradients of another shape than their forward's output were accepted."""
    full = OPS[name].bind_attrs(attrs)
    assert spec_rule(name, operands, full) is None
    assert registry_rule(name, operands, full) is None
    assert not validates(name, operands, full, [((1,), "float32")])
