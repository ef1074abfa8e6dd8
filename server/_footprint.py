"""What a graph makes the server hold, from its declared shapes, before anything is
allocated: the bytes of its ``full`` constants (computed once when it is compiled, then kept
with the plan), the plan's own bookkeeping (``plan_bytes``), and the most bytes of
intermediates alive at once while it runs (its arena).

The ledger charges the first two to the registering session when the graph is compiled, and
reserves the second for the duration of each run, so a graph over the limits is refused
before it allocates, not after.
"""

from __future__ import annotations

import math

from ..protocol import dtypes
from ..protocol.graph import Graph

PLAN_BYTES_PER_NODE = 1024
"""Bytes of Python objects a cached plan keeps per graph node (the decoded graph, its steps,
liveness): measured 0.85 KiB a node for a chain of 100 000 additions (about 85 MB); nodes
with attributes keep a little more. Charged with the constants, so the plan cache cannot
hold more than the memory limit (256 maximal plans would otherwise be about 22 GB)."""


def plan_bytes(graph: Graph) -> int:
    """What the server keeps while ``graph``'s compiled plan is cached (constants aside)."""
    return PLAN_BYTES_PER_NODE * (len(graph.nodes) + len(graph.inputs))


def spec_bytes(shape: tuple[int, ...], dtype: str) -> int:
    return math.prod(shape) * dtypes.to_numpy(dtype).itemsize


def output_bytes(graph: Graph) -> int:
    """Bytes of a graph's outputs, from their declared shapes (what a run stores)."""
    specs = list(graph.inputs)
    for node in graph.nodes:
        specs.extend(node.outputs)
    return sum(spec_bytes(*specs[k]) for k in graph.outputs)


def footprint(graph: Graph) -> tuple[int, int]:
    """(constant bytes, peak intermediate bytes) of a validated graph. Inputs are not
    counted (they are already held); outputs are, up to the end of the run."""
    sizes = [spec_bytes(*s) for s in graph.inputs]
    n_inputs = len(sizes)
    producer: list[int] = [-1] * n_inputs
    constants = 0
    kinds: list[str] = []
    for index, node in enumerate(graph.nodes):
        kinds.append(node.op)
        for spec in node.outputs:
            sizes.append(spec_bytes(*spec))
            producer.append(index)
        if node.op == "full":
            constants += sum(spec_bytes(*spec) for spec in node.outputs)
    last_use: dict[int, int] = {}
    for index, node in enumerate(graph.nodes):
        for i in node.inputs:
            last_use[i] = index
    kept = set(graph.outputs)
    dying: dict[int, list[int]] = {}
    for slot, last in last_use.items():
        if slot >= n_inputs and slot not in kept and kinds[producer[slot]] not in ("full", "value"):
            dying.setdefault(last, []).append(slot)
    live = peak = 0
    slot = n_inputs
    for index, node in enumerate(graph.nodes):
        produced = len(node.outputs)
        if node.op not in ("full", "value"):
            live += sum(sizes[slot : slot + produced])
            peak = max(peak, live)
        live -= sum(sizes[s] for s in dying.get(index, ()))
        slot += produced
    return constants, peak


__all__ = ["footprint", "spec_bytes"]
