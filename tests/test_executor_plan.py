"""Compiled plans keep what the server decides from: a backend that rewrites a plan (GPU and
OpenCL backends fuse elementwise chains into a new Plan) must not lose that the graph has a
collective, or the server would judge its replay cheap enough for the network loop, which
moves the collective's own bytes."""

from __future__ import annotations

from typing import Any

from burn_remote.engine.backend import get_backend
from burn_remote.engine.executor import compile_graph, input_check
from burn_remote.engine.fusion import fuse_plan
from burn_remote.protocol.graph import Graph, GraphNode


class _Rewriting:
    """The CPU backend, with a plan rewrite that builds a new Plan as fusion does."""

    def __init__(self) -> None:
        self._cpu = get_backend("cpu")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cpu, name)

    def optimize_plan(self, plan: Any) -> Any:
        return fuse_plan(plan, lambda program: None, min_ops=10**9)


def _graph(op: str, attrs: tuple = ()) -> Graph:
    spec = ((4,), "float32")
    return Graph(inputs=(spec,), nodes=(GraphNode(op, (0,), attrs, (spec,)),), outputs=(1,))


def test_a_rewritten_plan_still_says_it_has_a_collective() -> None:
    graph = _graph("all_reduce", (("group", 7), ("op", "sum")))
    plain = compile_graph(graph, get_backend("cpu"))
    rewritten = compile_graph(graph, _Rewriting())
    assert plain.collective
    assert rewritten is not plain and rewritten.collective


def test_a_plan_without_collectives_is_not_marked() -> None:
    assert not compile_graph(_graph("neg"), _Rewriting()).collective


def test_input_check_lists_the_graph_inputs_as_numpy_dtypes() -> None:
    import numpy as np

    plan = compile_graph(_graph("neg"), get_backend("cpu"))
    assert input_check(plan) == ([(4,)], [np.dtype(np.float32)])
