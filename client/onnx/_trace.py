"""Tracing a model into a primitive graph for export, and finding which sizes follow the
dynamic axes.

The recorded graph bakes the example's sizes into shape attributes (reshape, expand, full,
slice bounds). Each dynamic axis has a name (a symbol: "batch", "sequence"); axes with the
same name have the same size. To find what follows them, the model is traced again with each
symbol one and two larger (the example's entries repeated along that axis) and with each pair
of symbols one larger together, and the graphs are compared leaf by leaf: a value that never
moves is a constant; an integer that moves linearly in each symbol (B, T, B * T...) becomes a
`Dyn`, which the lowering turns into a Shape-based computation; anything else that moves (a
float such as the 1/B of a mean over the batch axis, or a graph whose structure changes) is
refused with the op's name, since no static ONNX graph reproduces it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._autograd import no_grad
from .._recorder import OpFailed
from .._tensor import Tensor


class ExportError(ValueError):
    """The model cannot be exported as asked; the message names the op and the reason."""


Terms = tuple[tuple[tuple[str, ...], int], ...]


@dataclass(frozen=True, slots=True)
class Dyn:
    """An integer that follows the dynamic axes: the sum of coef * (product of the symbols)
    over `terms` (the empty product is the constant); `value` is its size at the example."""

    value: int
    terms: Terms

    @property
    def symbol(self) -> str | None:
        """The axis name when this size is exactly one symbol (an ONNX dim_param)."""
        if len(self.terms) == 1 and len(self.terms[0][0]) == 1 and self.terms[0][1] == 1:
            return self.terms[0][0][0]
        return None

    @property
    def label(self) -> str | None:
        """The ONNX dim_param of this size: its symbol, or "a + b" for a plain sum of
        symbols (a decoder's attention mask spans "past_sequence_length + sequence_length")."""
        if self.symbol is not None:
            return self.symbol
        if all(len(names) == 1 and coef == 1 for names, coef in self.terms):
            return SUM.join(names[0] for names, _ in self.terms)
        return None


SUM = " + "
"""Joins symbols in the name of an axis that is their sum (``"past + sequence"``): such an
axis takes no size of its own, it grows with its parts."""


def parts(name: str) -> list[str]:
    """The symbols an axis name stands for: itself, or the parts of a sum."""
    return [p.strip() for p in name.split(SUM.strip())] if SUM.strip() in name else [name]


@dataclass(frozen=True, slots=True)
class Axes:
    """The dynamic axes of the model inputs: per input, axis -> symbol name (or a sum of
    symbols, "a + b", for an axis as long as those axes together)."""

    per_input: tuple[dict[int, str], ...]

    @property
    def symbols(self) -> list[str]:
        """Every dynamic axis name, sorted, with a sum axis ("a + b") counted as its parts: the
        names the exported graph's shapes are written in."""
        return sorted({p for axes in self.per_input for s in axes.values() for p in parts(s)})

    def sizes(self, arrays: Sequence[np.ndarray]) -> dict[str, int]:
        """Each symbol's size in the example; refuses axes of one name that differ, and a
        sum axis whose size is not the sum of its parts'."""
        out = self._single_sizes(arrays)
        for i, (a, axes) in enumerate(zip(arrays, self.per_input)):
            for axis, name in axes.items():
                if len(parts(name)) == 1:
                    continue
                missing = [p for p in parts(name) if p not in out]
                if missing:
                    raise ExportError(
                        f"dynamic axis {name!r} of input {i}: {missing[0]!r} is no other "
                        "input's axis, so its size is unknown"
                    )
                if a.shape[axis] != sum(out[p] for p in parts(name)):
                    raise ExportError(
                        f"dynamic axis {name!r} of input {i} has size {a.shape[axis]}, not "
                        f"the sum of its parts' sizes {[out[p] for p in parts(name)]}"
                    )
        return out

    def _single_sizes(self, arrays: Sequence[np.ndarray]) -> dict[str, int]:
        out: dict[str, int] = {}
        for i, (a, axes) in enumerate(zip(arrays, self.per_input)):
            for axis, name in axes.items():
                if len(parts(name)) > 1:
                    continue
                if not -a.ndim <= axis < a.ndim:
                    raise ExportError(f"dynamic axis {axis} of input {i}: it has {a.ndim} axes")
                n = a.shape[axis]
                if out.setdefault(name, n) != n:
                    raise ExportError(
                        f"dynamic axis {name!r} has size {out[name]} on one input and {n} on "
                        f"input {i}: axes with one name must have one size"
                    )
                if n == 0:
                    raise ExportError(f"dynamic axis {name!r} needs a non-empty example")
        return out

    def grow(self, arrays: Sequence[np.ndarray], delta: dict[str, int]) -> list[np.ndarray]:
        """The example with each symbol's axes `delta[symbol]` longer (entries repeated)."""
        out = []
        for a, axes in zip(arrays, self.per_input):
            for axis, name in axes.items():
                extra = sum(delta.get(p, 0) for p in parts(name))
                if extra:
                    n = a.shape[axis]
                    a = np.take(a, np.arange(n + extra) % n, axis=axis)
            out.append(a)
        return out


@dataclass(slots=True)
class TraceNode:
    op: str
    inputs: tuple[int, ...]
    attrs: dict[str, Any]
    """Bound attributes; integers that follow the batch are `Dyn`."""
    outputs: tuple[int, ...]
    specs: tuple[tuple[tuple[Any, ...], str], ...]
    """(shape, dtype) per output; a dim that follows the batch is a `Dyn`."""
    value: Any = None
    """The bound scalar of a `value` node."""


@dataclass(slots=True)
class Trace:
    """A pruned primitive graph: relative ids, the model inputs and the weights' values."""

    specs: dict[int, tuple[tuple[Any, ...], str]]
    nodes: list[TraceNode]
    model_inputs: list[int]
    weights: dict[int, np.ndarray]
    weight_tensors: dict[int, int]
    """Relative id -> concrete tensor id of each weight (to name it after its parameter)."""
    outputs: list[int]
    axes: Axes | None
    """The dynamic axes of the model inputs (None: every size fixed)."""


def _flatten(out: Any) -> list[Tensor]:
    items = list(out) if isinstance(out, list | tuple) else [out]
    if not items or not all(isinstance(t, Tensor) for t in items):
        raise ExportError("the model must return a tensor or a tuple/list of tensors")
    return items


def _record(fn: Callable[..., Any], dev: Any, arrays: Sequence[np.ndarray]):
    rec = dev._rec
    xs = [dev.tensor(a) for a in arrays]
    with no_grad(), rec.held():
        try:
            outs = _flatten(fn(*xs))
        except OpFailed as exc:
            raise ExportError(f"the model reads tensor data while it runs: {exc}") from None
        finally:
            capture = rec.capture()  # taken either way: a failed trace leaves nothing pending
    if capture is None:
        raise ExportError("the model recorded no ops: there is nothing to export")
    graph = capture.graph
    out_rel = []
    for t in outs:
        if t._id not in capture.output_ids:
            raise ExportError("a model output is not computed by the model (an input or weight?)")
        out_rel.append(graph.outputs[capture.output_ids.index(t._id)])
    in_rel = []
    for x in xs:
        if x._id not in capture.input_ids:
            raise ExportError("a model input is not used by the model")
        in_rel.append(capture.input_ids.index(x._id))
    return capture, in_rel, out_rel


Point = tuple[int, ...]
"""How much larger each symbol is in one trace (in `Axes.symbols` order)."""


def _points(k: int) -> list[Point]:
    """The example, each symbol +1 and +2, each pair of symbols +1 together."""
    unit = [tuple(int(j == i) for j in range(k)) for i in range(k)]
    pts: list[Point] = [(0,) * k]
    pts += unit + [tuple(2 * x for x in u) for u in unit]
    pts += [
        tuple(a + b for a, b in zip(unit[i], unit[j])) for i in range(k) for j in range(i + 1, k)
    ]
    return pts


def _fit(where: str, leaves: dict[Point, Any], names: Sequence[str], sizes: Sequence[int]) -> Any:
    """One leaf over the traces: a constant, a `Dyn`, or an ExportError."""
    zero = (0,) * len(names)
    v0 = leaves[zero]
    values = list(leaves.values())
    if isinstance(v0, tuple):
        if not all(isinstance(v, tuple) and len(v) == len(v0) for v in values):
            raise ExportError(f"{where}: changes shape with a dynamic axis")
        return tuple(
            _fit(where, {p: v[i] for p, v in leaves.items()}, names, sizes) for i in range(len(v0))
        )
    if all(type(v) is type(v0) and v == v0 for v in values):
        return v0
    if not all(type(v) is int for v in values):
        moved = next(p for p, v in leaves.items() if v != v0)
        raise _unexpressible(where, v0, leaves[moved], names, moved)
    k = len(names)
    unit = [tuple(int(j == i) for j in range(k)) for i in range(k)]
    slope = [leaves[u] - v0 for u in unit]
    for i, u in enumerate(unit):
        two = tuple(2 * x for x in u)
        if leaves[two] != v0 + 2 * slope[i]:
            raise _unexpressible(where, v0, leaves[two], names, two)
    cross = {}
    for i in range(k):
        for j in range(i + 1, k):
            both = tuple(a + b for a, b in zip(unit[i], unit[j]))
            c = leaves[both] - v0 - slope[i] - slope[j]
            if c:
                cross[(i, j)] = c
    # v = c0 + sum a_i x_i + sum c_ij x_i x_j, with x = sizes + point (exact when multilinear)
    linear = list(slope)
    for (i, j), c in cross.items():
        linear[i] -= c * sizes[j]
        linear[j] -= c * sizes[i]
    const = v0 - sum(a * n for a, n in zip(linear, sizes))
    const -= sum(c * sizes[i] * sizes[j] for (i, j), c in cross.items())
    terms: list[tuple[tuple[str, ...], int]] = [((names[i],), a) for i, a in enumerate(linear) if a]
    terms += [((names[i], names[j]), c) for (i, j), c in cross.items()]
    if const:
        terms.append(((), const))
    return Dyn(v0, tuple(terms))


def _unexpressible(where: str, v0: Any, v: Any, names: Sequence[str], p: Point) -> ExportError:
    grown = ", ".join(f"{n}+{d}" for n, d in zip(names, p) if d)
    return ExportError(
        f"{where}: {v0!r} at the example becomes {v!r} at {grown}, which dynamic axes cannot "
        "express; export with fewer dynamic axes (dynamic_batch=False for none)"
    )


SHRINK = 3
"""How much smaller an example at the model's largest size is traced (it, +1 and +2 are
then all below that size)."""


class _GrowFailed(Exception):
    """Recording at a larger size raised; ``error`` says so for the user."""

    def __init__(self, error: ExportError) -> None:
        super().__init__(str(error))
        self.error = error


def _traces(
    fn: Callable[..., Any],
    dev: Any,
    arrays: Sequence[np.ndarray],
    axes: Any,
    names: Sequence[str],
    capture: Any,
    in_rel: Any,
    out_rel: Any,
) -> dict[Point, Any]:
    """The graphs recorded at each of ``_points`` (the example's own first)."""
    points = _points(len(names))
    graphs = {points[0]: capture.graph}
    for p in points[1:]:
        delta = dict(zip(names, p))
        try:
            more, in_more, out_more = _record(fn, dev, axes.grow(arrays, delta))
        except ExportError:
            raise
        except Exception as exc:
            grown = ", ".join(f"{n}+{d}" for n, d in delta.items() if d)
            raise _GrowFailed(
                ExportError(
                    f"tracing the model at {grown} (to find what follows the dynamic axes) "
                    f"failed: {exc}; export from an example that leaves room on those axes"
                )
            ) from None
        if (in_more, out_more) != (in_rel, out_rel):
            raise ExportError("the model's graph changes with a dynamic axis")
        graphs[p] = more.graph
    return graphs


def trace(
    fn: Callable[..., Any], dev: Any, arrays: Sequence[np.ndarray], axes: Axes | None
) -> Trace:
    """Record `fn(*arrays)` without running it; with dynamic `axes`, find what follows them."""
    names = axes.symbols if axes is not None else []
    sizes = axes.sizes(arrays) if axes is not None else {}
    capture, in_rel, out_rel = _record(fn, dev, arrays)
    try:
        graphs = _traces(fn, dev, arrays, axes, names, capture, in_rel, out_rel)
    except _GrowFailed as grown:
        # An example at the model's largest size (a GPT at its full context) cannot grow;
        # what follows the axes shows as well from a smaller example (traced at it, +1 and
        # +2, all within the model), and the exported sizes stay symbolic.
        shrink = {n: -SHRINK for n in names if sizes[n] > SHRINK}
        if not shrink or axes is None:
            raise grown.error from None
        arrays = axes.grow(arrays, shrink)
        sizes = axes.sizes(arrays)
        capture, in_rel, out_rel = _record(fn, dev, arrays)
        try:
            graphs = _traces(fn, dev, arrays, axes, names, capture, in_rel, out_rel)
        except _GrowFailed:
            raise grown.error from None
    g0 = capture.graph
    gs = list(graphs.values())
    if any(len(g.nodes) != len(g0.nodes) or len(g.inputs) != len(g0.inputs) for g in gs[1:]):
        raise ExportError("the model's graph changes with a dynamic axis")
    n_list = [sizes[n] for n in names]
    fit = lambda where, leaves: _fit(where, dict(zip(graphs, leaves)), names, n_list)  # noqa: E731
    specs: dict[int, tuple[tuple[Any, ...], str]] = {}
    for i in range(len(g0.inputs)):
        specs[i] = _merge_spec(f"input {i}", [g.inputs[i] for g in gs], fit)
    nodes = []
    rel = len(g0.inputs)
    values = iter(capture.values)
    for index, node in enumerate(g0.nodes):
        where = f"node {index} ({node.op})"
        others = [g.nodes[index] for g in gs]
        if any(
            (o.op, o.inputs, [k for k, _ in o.attrs])
            != (node.op, node.inputs, [k for k, _ in node.attrs])
            for o in others
        ):
            raise ExportError(f"{where}: the model's graph changes with a dynamic axis")
        attrs = {
            key: fit(f"{where} attribute {key!r}", [dict(o.attrs)[key] for o in others])
            for key, _ in node.attrs
        }
        outs = tuple(range(rel, rel + len(node.outputs)))
        rel += len(node.outputs)
        out_specs = tuple(
            _merge_spec(where, [o.outputs[k] for o in others], fit)
            for k in range(len(node.outputs))
        )
        specs.update(zip(outs, out_specs))
        value = next(values) if node.op == "value" else None
        nodes.append(TraceNode(node.op, node.inputs, attrs, outs, out_specs, value))
    nodes = _prune(nodes, out_rel)
    used = {i for n in nodes for i in n.inputs}
    weight_tensors = {
        i: tid for i, tid in enumerate(capture.input_ids) if i not in in_rel and i in used
    }
    rec = dev._rec
    weights = {i: np.asarray(rec.read(tid)) for i, tid in weight_tensors.items()}
    return Trace(specs, nodes, in_rel, weights, weight_tensors, out_rel, axes)


def _merge_spec(where: str, specs: Sequence[Any], fit: Any) -> tuple[tuple[Any, ...], str]:
    if len(specs) == 1:
        return tuple(specs[0][0]), specs[0][1]
    if len({s[1] for s in specs}) != 1:
        raise ExportError(f"{where}: the dtype changes with a dynamic axis")
    return fit(where, [tuple(s[0]) for s in specs]), specs[0][1]


def _prune(nodes: list[TraceNode], outputs: Sequence[int]) -> list[TraceNode]:
    """Drop nodes that no output depends on (work the model did but did not return)."""
    needed = set(outputs)
    kept = []
    for node in reversed(nodes):
        if needed.intersection(node.outputs):
            kept.append(node)
            needed.update(node.inputs)
    return kept[::-1]
