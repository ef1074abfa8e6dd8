"""Runs of elementwise steps computed a block at a time (engine/backends/numpy_blocks.py).

Oracle: the same graph run by the plain executor (every step on whole arrays, no plan
rewrite). Every element goes through the same kernels, so every result must keep its bits,
infinities and NaNs included; and the rewrite must have happened, or the test proves nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
from burn_remote.engine.backends import cpu_threads, numpy_blocks
from burn_remote.engine.backends.numpy_backend import NumpyBackend
from burn_remote.engine.executor import Executor, compile_graph
from burn_remote.protocol.graph import Graph, GraphNode

F32, BOOL = "float32", "bool"


class _PlainCpu(NumpyBackend):
    """The CPU backend with no plan rewrite: each step on whole arrays."""

    writes_into = {}

    def optimize_plan(self, plan):
        return plan


def _swiglu_backward(shape: tuple[int, ...]) -> Graph:
    """SwiGLU's backward as autodiff writes it (eight steps in a row), with a (C,) weight and
    a (..., 1) scale broadcast into it, a compare feeding a where, and two results read after
    the run (one of them from its middle) besides its last."""
    lead, c = shape[:-1], shape[-1]
    ins = ((shape, F32),) * 5 + (((c,), F32), ((*lead, 1), F32), ((), F32))
    dh, u, silu, s, g, w, r, one = range(8)

    def node(op, *args):
        return GraphNode(op, args, (), ((shape, BOOL if op == "gt" else F32),))

    nodes = (
        node("mul", dh, u),  # 8
        node("mul", dh, silu),  # 9: read after the run
        node("mul", 8, s),  # 10
        node("mul", 8, g),  # 11
        node("mul", 11, s),  # 12
        node("sub", one, s),  # 13
        node("mul", 12, 13),  # 14
        node("add", 10, 14),  # 15
        node("mul", 15, w),  # 16
        node("gt", 16, r),  # 17
        node("where", 17, 16, one),  # 18: the run's last
        GraphNode("sum", (9,), (("axes", (len(shape) - 1,)), ("keepdims", False)), ((lead, F32),)),
    )
    return Graph(inputs=ins, nodes=nodes, outputs=(18, 19, 12))


def _inputs(shape: tuple[int, ...], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    big = [(rng.standard_normal(shape) * 3).astype(np.float32) for _ in range(5)]
    big[0].reshape(-1)[:4] = (np.inf, -np.inf, np.nan, -0.0)
    big[3].reshape(-1)[7] = np.nan
    return [
        *big,
        rng.standard_normal(shape[-1]).astype(np.float32),
        rng.standard_normal((*shape[:-1], 1)).astype(np.float32),
        np.asarray(1, np.float32),
    ]


def _both(graph: Graph, inputs: list[np.ndarray]):
    fast = compile_graph(graph, NumpyBackend())
    plain = compile_graph(graph, _PlainCpu())
    with np.errstate(all="ignore"):
        want = Executor(_PlainCpu()).run(plain, [a.copy() for a in inputs], [])
        got = Executor(NumpyBackend()).run(fast, [a.copy() for a in inputs], [])
    return fast, got, want


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # inf - inf in the pool's threads
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape,block", [((4, 128, 1536), 1 << 16), ((3, 50, 700), 1000),
                                         ((70000,), 4096)])  # fmt: skip
def test_a_run_keeps_every_bit_of_its_steps(shape, block, threads, monkeypatch) -> None:
    monkeypatch.setattr(numpy_blocks, "BLOCK_ELEMENTS", block)
    monkeypatch.setattr(cpu_threads, "PARALLEL_MIN_WORK", 0)  # blocks on the pool too
    before = cpu_threads.threads()
    try:
        cpu_threads.set_threads(threads)
        fast, got, want = _both(_swiglu_backward(shape), _inputs(shape))
    finally:
        cpu_threads.set_threads(before)
    runs = [s for s in fast.steps if s.op.startswith("elementwise_run:")]
    assert len(runs) == 1 and runs[0].op.count("+") == 10  # all eleven steps, one run
    assert len(runs[0].outputs) == 3  # the last, the one the sum reads, a graph output
    assert len(got) == len(want) == 3
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert np.array_equal(a, b, equal_nan=True)
        assert a.base is None  # its own array: a later step may write into it


def test_an_operand_that_is_not_contiguous_runs_the_steps_whole() -> None:
    shape = (4, 128, 576)
    graph = _swiglu_backward(shape)
    inputs = _inputs(shape, seed=1)
    inputs[1] = np.ascontiguousarray(inputs[1].transpose(1, 0, 2)).transpose(1, 0, 2)
    assert not inputs[1].flags.c_contiguous
    fast, got, want = _both(graph, inputs)
    assert any(s.op.startswith("elementwise_run:") for s in fast.steps)
    for a, b in zip(got, want):
        assert np.array_equal(a, b, equal_nan=True)


def test_rows_are_cut_only_on_axes_every_operand_has_whole_or_lacks() -> None:
    attn = (4, 3, 3, 128, 64)
    lead = numpy_blocks.lead_axes
    assert lead([attn, (128, 64), ()], attn) == 3  # rope's cos, the same for every head
    assert lead([(4, 128, 576), (576,), (4, 128, 1)], (4, 128, 576)) == 2
    assert lead([(4, 128, 576), (4, 1, 576)], (4, 128, 576)) == 1
    assert lead([(1, 128, 576), (4, 1, 576)], (4, 128, 576)) == 1
    assert lead([(70000,), ()], (70000,)) == 1


def test_small_or_mixed_shapes_stay_as_they_are() -> None:
    small = (4, 8, 16)
    assert not any(
        s.op.startswith("elementwise_run:")
        for s in compile_graph(_swiglu_backward(small), NumpyBackend()).steps
    )
