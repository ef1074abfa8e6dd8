"""The graph form: what a sync point turns pending ops into, hashed and shipped as is.

Tensor ids inside a graph are relative: graph inputs are numbered 0..k-1 in order of first
use, then each node's outputs in order. The hash covers structure only (op names, attributes,
dtypes, shapes, relative ids), never concrete tensor ids, bound scalar values or data, so a
training step replays the same graph with new bindings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .registry import OPS, ShapeError

GRAPH_FORMAT = 1
MAX_GRAPH_NODES = 100_000
"""A graph larger than this is refused (the client flushes long before: MAX_PENDING_OPS)."""

MAX_GRAPH_NDIM = 32
"""Dimensions of any tensor a graph declares."""
MAX_GRAPH_ELEMENTS = 2**48
"""Elements of any tensor a graph declares (a shape like 2**62 is refused when decoded,
before any size is computed from it; the server's memory limits refuse far less)."""

Spec = tuple[tuple[int, ...], str]


class GraphError(ValueError):
    """A graph failed validation; `node` is the index of the offending node, if any."""

    def __init__(self, message: str, node: int | None = None) -> None:
        super().__init__(message)
        self.node = node


@dataclass(frozen=True, slots=True)
class GraphNode:
    op: str
    """Registry name of a primitive op."""
    inputs: tuple[int, ...]
    """Relative ids of the operands."""
    attrs: tuple[tuple[str, Any], ...]
    """Attributes sorted by name; values are msgpack scalars or nested tuples of them."""
    outputs: tuple[Spec, ...]
    """(shape, dtype) of each output; their relative ids follow on from the previous node's."""


@dataclass(frozen=True, slots=True)
class Graph:
    inputs: tuple[Spec, ...]
    """(shape, dtype) of each graph input (a tensor that exists before the graph runs)."""
    nodes: tuple[GraphNode, ...]
    outputs: tuple[int, ...]
    """Relative ids the caller keeps; every other intermediate dies inside the graph."""

    def encode(self) -> bytes:
        """Canonical msgpack: the same graph gives the same bytes in any process."""
        import msgpack  # loaded at the first sync, not with `import burn_remote`

        return msgpack.packb(
            [
                GRAPH_FORMAT,
                [list(s) for s in self.inputs],
                [
                    [n.op, n.inputs, [list(kv) for kv in n.attrs], [list(s) for s in n.outputs]]
                    for n in self.nodes
                ],
                self.outputs,
            ],
            use_bin_type=True,
        )

    def digest(self) -> str:
        """The sha256 (hex) of the graph's encoding: the name a server caches its compiled plan
        under, so equal graphs from any client share one plan."""
        import hashlib

        return hashlib.sha256(self.encode()).hexdigest()


def canonical(graph: Graph) -> Graph:
    """The canonical form of a validated graph: every declared attribute present (defaults
    filled in) and attributes sorted by name. Equal graphs have equal canonical encodings,
    hence one digest: a server computes the digest of this form, never of the bytes sent."""
    nodes = tuple(
        GraphNode(n.op, n.inputs, canonical_attrs(OPS[n.op].bind_attrs(dict(n.attrs))), n.outputs)
        for n in graph.nodes
    )
    return Graph(graph.inputs, nodes, graph.outputs)


def _tuples(obj: Any) -> Any:
    if isinstance(obj, list | tuple):
        return tuple(_tuples(x) for x in obj)
    return obj


def _spec(raw: Any) -> Spec:
    shape, dtype = raw
    if not isinstance(dtype, str) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise GraphError(f"bad tensor spec {raw!r}")
    if len(shape) > MAX_GRAPH_NDIM:
        raise GraphError(f"tensor of {len(shape)} dimensions; the limit is {MAX_GRAPH_NDIM}")
    if math.prod(d or 1 for d in shape) > MAX_GRAPH_ELEMENTS:  # a 0 counts as 1: NumPy
        raise GraphError(  # cannot make [2**40, 2**40, 0] although it holds nothing
            f"tensor of shape {list(shape)} has more than {MAX_GRAPH_ELEMENTS} elements "
            "(counting each 0 as 1)"
        )
    return tuple(shape), dtype


class _Specs(dict[Any, Spec]):
    """Specs checked once each: a graph repeats a handful of (shape, dtype) pairs over
    thousands of nodes, and its nodes share one tuple per pair."""

    def __missing__(self, raw: Any) -> Spec:
        spec = self[raw] = _spec(raw)
        return spec


def _ids(raw: Any) -> tuple[int, ...]:
    if all(type(i) is int for i in raw):
        return raw if type(raw) is tuple else tuple(raw)
    return tuple(int(i) for i in raw)


_ATTR_SCALARS = (int, float, bool, str, type(None))


def _attr_value(name: str, value: Any, node: int) -> Any:
    if type(value) is tuple:
        for item in value:
            _attr_value(name, item, node)
    elif type(value) not in _ATTR_SCALARS:
        raise GraphError(
            f"node {node}: attribute {name!r} holds a {type(value).__name__}; attribute values "
            "are nil, int, float, bool, str or arrays of them (protocol/README.md section 5)",
            node,
        )
    return value


def _attrs(raw: Any, node: int) -> tuple[tuple[str, Any], ...]:
    """A node's [name, value] pairs, as section 5 allows them: str names, each once, and
    values that are msgpack scalars or arrays (a bin or a map would pass for an array of
    ints or of keys in an op's rule)."""
    out = tuple((str(k), _attr_value(str(k), v, node)) for k, v in raw)
    if len({k for k, _ in out}) != len(out):
        raise GraphError(f"node {node}: an attribute named twice in {[k for k, _ in out]}", node)
    return out


def decode(data: bytes, max_nodes: int = MAX_GRAPH_NODES) -> Graph:
    """Parse the canonical form; any deviation raises GraphError naming what was wrong.

    Decoded as tuples, never lists: the server decodes graphs of up to MAX_GRAPH_NODES
    nodes, and lists would be a few hundred thousand objects for the garbage collector to
    walk (again and again while the graph is built) where tuples of numbers and strings are
    soon left out of its walks.
    """
    import msgpack

    try:
        raw = msgpack.unpackb(
            data, raw=False, strict_map_key=True, use_list=False, max_array_len=4 * max_nodes
        )
        fmt_version, inputs, nodes, outputs = raw
        if fmt_version != GRAPH_FORMAT:
            raise GraphError(f"graph format {fmt_version!r} is not {GRAPH_FORMAT}")
        if len(nodes) > max_nodes:
            raise GraphError(f"graph has {len(nodes)} nodes; the limit is {max_nodes}")
        specs = _Specs()
        return Graph(
            inputs=tuple(specs[s] for s in inputs),
            nodes=tuple(
                GraphNode(
                    op=op if type(op) is str else str(op),
                    inputs=_ids(ins),
                    attrs=_attrs(attrs, index),
                    outputs=tuple(specs[s] for s in outs),
                )
                for index, (op, ins, attrs, outs) in enumerate(nodes)
            ),
            outputs=_ids(outputs),
        )
    except GraphError:
        raise
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise GraphError(f"malformed graph encoding: {exc}") from None


@dataclass(frozen=True, slots=True)
class _SpecView:
    shape: tuple[int, ...]
    dtype: str


def validate(graph: Graph) -> None:
    """Check a graph against the registry: known primitives, arity, attributes, shapes.

    The server runs this on every graph it registers, so a graph that passes cannot make a
    kernel see operands its shape rule did not accept.
    """
    specs: list[Spec] = list(graph.inputs)
    for index, node in enumerate(graph.nodes):
        op = OPS.get(node.op)
        where = f"node {index} ({node.op})"
        if op is None or not op.primitive:
            raise GraphError(f"{where}: unknown op {node.op!r}", index)
        if op.arity is not None and len(node.inputs) != op.arity:
            raise GraphError(f"{where}: expected {op.arity} inputs, got {len(node.inputs)}", index)
        if any(not 0 <= i < len(specs) for i in node.inputs):
            raise GraphError(f"{where}: input id out of range", index)
        try:
            attrs = op.bind_attrs(dict(node.attrs))
            inferred = op.shapes([_SpecView(*specs[i]) for i in node.inputs], attrs)
        except (ShapeError, TypeError, ValueError, KeyError, IndexError) as exc:
            raise GraphError(f"{where}: {exc}", index) from None
        inferred = [(tuple(s), d) for s, d in inferred]
        if inferred != list(node.outputs):
            raise GraphError(
                f"{where}: declared outputs {node.outputs} but the op gives {inferred}", index
            )
        specs.extend(node.outputs)
    if any(not 0 <= i < len(specs) for i in graph.outputs):
        raise GraphError("graph output id out of range")


_SCALARS = (int, float, bool, str, type(None))


def canonical_attrs(attrs: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Attributes in hash order, lists turned into tuples so they hash and compare.

    Called for every recorded op: scalar values (most of them) skip the recursive walk.
    """
    return tuple(sorted((k, v if type(v) in _SCALARS else _tuples(v)) for k, v in attrs.items()))
