"""Tracing a model into a primitive graph for export, and finding which sizes follow the batch.

The recorded graph bakes the example's batch size into shape attributes (reshape, expand,
full, slice bounds). To export a dynamic batch axis, the model is traced three times, at
batches B, B+1 and B+2 (the example's rows repeated), and the three graphs are compared leaf
by leaf: a value that is the same in all three is a constant; an integer that moves linearly
with the batch becomes `Dyn(value, scale, offset)` (= scale * batch + offset), which the
lowering turns into a Shape-based computation; anything else that moves (a float such as the
1/B of a mean over the batch axis, or a graph whose structure changes) is refused with the
op's name, since no static ONNX graph reproduces it.
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


@dataclass(frozen=True, slots=True)
class Dyn:
    """An integer that follows the batch size: scale * batch + offset (`value` at the example)."""

    value: int
    scale: int
    offset: int


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
    batch: int
    dynamic: bool


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


def _merge(where: str, leaves: Sequence[Any], batch: int) -> Any:
    """One leaf of the three traces: a constant, a `Dyn`, or an ExportError."""
    v0, v1, v2 = leaves
    if isinstance(v0, tuple):
        if not all(isinstance(v, tuple) and len(v) == len(v0) for v in leaves):
            raise ExportError(f"{where}: changes shape with the batch size")
        return tuple(_merge(where, parts, batch) for parts in zip(v0, v1, v2))
    if type(v0) is type(v1) is type(v2) and v0 == v1 == v2:
        return v0
    if all(type(v) is int for v in leaves):
        scale = v1 - v0
        offset = v0 - scale * batch
        if v2 == scale * (batch + 2) + offset:
            return Dyn(v0, scale, offset)
    raise ExportError(
        f"{where}: {v0!r} at batch {batch} becomes {v1!r} at batch {batch + 1}, which a "
        "dynamic batch axis cannot express; export with dynamic_batch=False"
    )


def _rows(a: np.ndarray, n: int) -> np.ndarray:
    return np.take(a, np.arange(n) % a.shape[0], axis=0)


def trace(fn: Callable[..., Any], dev: Any, arrays: Sequence[np.ndarray], dynamic: bool) -> Trace:
    """Record `fn(*arrays)` without running it; with `dynamic`, find what follows the batch."""
    batch = 0
    if dynamic:
        if any(a.ndim == 0 for a in arrays) or len({a.shape[0] for a in arrays}) != 1:
            raise ExportError("dynamic_batch needs every model input to share a leading axis")
        batch = arrays[0].shape[0]
        if batch == 0:
            raise ExportError("dynamic_batch needs a non-empty example batch")
    capture, in_rel, out_rel = _record(fn, dev, arrays)
    graphs = [capture.graph]
    if dynamic:
        for extra in (1, 2):
            more, in_more, out_more = _record(fn, dev, [_rows(a, batch + extra) for a in arrays])
            if (in_more, out_more) != (in_rel, out_rel):
                raise ExportError("the model's graph changes with the batch size")
            graphs.append(more.graph)
    g0 = graphs[0]
    if any(len(g.nodes) != len(g0.nodes) or len(g.inputs) != len(g0.inputs) for g in graphs[1:]):
        raise ExportError("the model's graph changes with the batch size")
    specs: dict[int, tuple[tuple[Any, ...], str]] = {}
    for i in range(len(g0.inputs)):
        specs[i] = _merge_spec(f"input {i}", [g.inputs[i] for g in graphs], batch)
    nodes = []
    rel = len(g0.inputs)
    values = iter(capture.values)
    for index, node in enumerate(g0.nodes):
        where = f"node {index} ({node.op})"
        others = [g.nodes[index] for g in graphs]
        if any(
            (o.op, o.inputs, [k for k, _ in o.attrs])
            != (node.op, node.inputs, [k for k, _ in node.attrs])
            for o in others
        ):
            raise ExportError(f"{where}: the model's graph changes with the batch size")
        attrs = {
            key: _merge(f"{where} attribute {key!r}", [dict(o.attrs)[key] for o in others], batch)
            if dynamic
            else value
            for key, value in node.attrs
        }
        outs = tuple(range(rel, rel + len(node.outputs)))
        rel += len(node.outputs)
        out_specs = tuple(
            _merge_spec(where, [o.outputs[k] for o in others], batch)
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
    return Trace(specs, nodes, in_rel, weights, weight_tensors, out_rel, batch, dynamic)


def _merge_spec(where: str, specs: Sequence[Any], batch: int) -> tuple[tuple[Any, ...], str]:
    if len(specs) == 1:
        return tuple(specs[0][0]), specs[0][1]
    if len({s[1] for s in specs}) != 1:
        raise ExportError(f"{where}: the dtype changes with the batch size")
    return _merge(where, [tuple(s[0]) for s in specs], batch), specs[0][1]


def _prune(nodes: list[TraceNode], outputs: Sequence[int]) -> list[TraceNode]:
    """Drop nodes that no output depends on (work the model did but did not return)."""
    needed = set(outputs)
    kept = []
    for node in reversed(nodes):
        if needed.intersection(node.outputs):
            kept.append(node)
            needed.update(node.inputs)
    return kept[::-1]
