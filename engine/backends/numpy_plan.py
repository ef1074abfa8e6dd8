"""The CPU backend's rewrite of a compiled plan: a batched weight gradient becomes one GEMM.

Autodiff writes the gradient of ``x @ W`` (x batched (B, T, K), W shared (K, N)) as
``matmul(permute(x), g)`` -> (B, K, N), summed over the batch (``unbroadcast``), reshaped to
(K, N), and, for ``F.linear``'s ``W.T``, permuted back to (N, K). Run as written that is B
small GEMMs into a (B, K, N) intermediate (309 MB for GPT-2's tied LM head at 2 x 128
tokens), a reduction over it, and a transposed result that the optimizer copies before its
update. The same sum is one GEMM over all B*T rows, ``x2.T @ g2`` (or ``g2.T @ x2`` when the
result is transposed), on views of the operands as they lie, written in the layout the
chain ends in. Only the order of the additions changes (the batch's partial sums are added
inside the GEMM): results agree with the chain to float32 rounding (tests/test_cpu_engine.py
bounds the relative difference by 1e-6 of the result's norm).

A training step's cross-entropy also runs twice over the logits as written: the forward's
log-sum-exp, then the backward's softmax, each with its own max, exp and sum over a
(tokens x vocab) array (51 MB for GPT-2 at 2 x 128 tokens). When a plan holds both for the
same logits, and the backward's incoming gradient exists before the forward runs (a loss's
backward seeds it with a constant), the two become one step at the forward's place:
``cross_entropy_with_grad`` computes the exponentials once, a few rows at a time so each
block's passes stay in cache, the rows spread over the engine's threads. Every element goes
through the same operations in the same order as the two kernels apart, so the loss and the
gradient keep their bits (tests/test_cpu_engine.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np

from ..executor import Plan, Step
from ..fusion import slot_shapes, with_steps
from .cpu_threads import TRANSCENDENTAL_PASSES, run_parallel, shares, threads
from .numpy_blocks import block_elementwise_runs
from .numpy_kernels import KERNELS, all_counted

CE_BLOCK_BYTES = 1 << 19
"""Logits per block of the fused cross-entropy: its max, subtract, exp, sum, divide and
scale passes run over a block this size (a few vocabulary rows) while it sits in L2."""


def optimize_plan(plan: Plan) -> Plan:
    """The plan with every batched weight-gradient chain made one step, each
    cross-entropy's forward and backward made one, and each run of elementwise steps made one
    (numpy_blocks); else unchanged."""
    shapes = slot_shapes(plan)
    uses: dict[int, int] = {}
    for st in plan.steps:
        for i in st.inputs:
            uses[i] = uses.get(i, 0) + 1
    for o in plan.outputs:
        uses[o] = uses.get(o, 0) + 1
    consumer = {i: n for n, st in enumerate(plan.steps) for i in st.inputs}
    replaced: dict[int, Step] = {}
    absorbed: set[int] = set()
    for n, st in enumerate(plan.steps):
        if n in absorbed:
            continue
        chain = _weight_grad_chain(plan.steps, n, shapes, uses, consumer)
        if chain is None:
            chain = _transposed_matmul(plan.steps, n, uses, consumer)
        if chain is None:
            continue
        members, transposed = chain
        last = plan.steps[members[-1]]
        summed = plan.steps[members[1]].op == "sum"
        kernel = (
            partial(matmul_batch_sum, out_shape=shapes[last.outputs[0]], transposed=transposed)
            if summed
            else matmul_transposed
        )
        replaced[members[-1]] = Step(
            node=st.node,
            op="matmul",
            kernel=kernel,
            inputs=st.inputs,
            outputs=last.outputs,
            attrs={},
            dtypes=last.dtypes,
            release=(),
        )
        absorbed.update(members[:-1])
    for forward, backward in _cross_entropy_pairs(plan.steps):
        f, b = plan.steps[forward], plan.steps[backward]
        replaced[forward] = Step(
            node=f.node,
            op="cross_entropy",
            kernel=cross_entropy_with_grad,
            inputs=b.inputs,
            outputs=(f.outputs[0], b.outputs[0]),
            attrs=f.attrs,
            dtypes=(f.dtypes[0], b.dtypes[0]),
            release=(),
        )
        absorbed.add(backward)
    if replaced:
        steps = [replaced.get(n, st) for n, st in enumerate(plan.steps) if n not in absorbed]
        plan = with_steps(plan, steps)
    return block_elementwise_runs(plan)


def _weight_grad_chain(
    steps: Sequence[Step],
    n: int,
    shapes: list[tuple[int, ...]],
    uses: dict[int, int],
    consumer: dict[int, int],
) -> tuple[list[int], bool] | None:
    """(step indices of the chain matmul -> sum [-> reshape] [-> permute], whether it ends
    transposed), for a batched matmul whose batch axes are summed away; None otherwise."""
    st = steps[n]
    if st.op != "matmul":
        return None
    a, b = (shapes[i] for i in st.inputs)
    out = shapes[st.outputs[0]]
    lead = len(out) - 2
    if lead < 1 or a[:-2] != out[:-2] or b[:-2] != out[:-2]:
        return None  # not batched, or an operand broadcast over the batch
    nxt = _only_consumer(steps, st, uses, consumer)
    if nxt is None or steps[nxt].op != "sum" or not steps[nxt].attrs.get("keepdims"):
        return None
    axes = steps[nxt].attrs.get("axes")
    axes = (axes,) if isinstance(axes, int) else tuple(axes or ())
    if tuple(sorted(x % len(out) for x in axes)) != tuple(range(lead)):
        return None
    members = [n, nxt]
    reshape = _only_consumer(steps, steps[nxt], uses, consumer)
    if reshape is None or steps[reshape].op != "reshape":
        return members, False
    if shapes[steps[reshape].outputs[0]] != out[-2:]:
        return members, False
    members.append(reshape)
    permute = _only_consumer(steps, steps[reshape], uses, consumer)
    if (
        permute is not None
        and steps[permute].op == "permute"
        and tuple(steps[permute].attrs.get("dims", ())) == (1, 0)
    ):
        members.append(permute)
        return members, True
    return members, False


def _transposed_matmul(
    steps: Sequence[Step], n: int, uses: dict[int, int], consumer: dict[int, int]
) -> tuple[list[int], bool] | None:
    """(matmul, permute) where the permute swaps the matmul's last two axes (a 2-D weight
    gradient of ``F.linear``): computed as the transposed product, written C-ordered, so the
    optimizer reads it without a copy."""
    st = steps[n]
    if st.op != "matmul":
        return None
    nxt = _only_consumer(steps, st, uses, consumer)
    if nxt is None or steps[nxt].op != "permute":
        return None
    dims = tuple(steps[nxt].attrs.get("dims", ()))
    nd = len(dims)
    if nd < 2 or dims != (*range(nd - 2), nd - 1, nd - 2):
        return None
    return [n, nxt], True


def _cross_entropy_pairs(steps: Sequence[Step]) -> list[tuple[int, int]]:
    """(forward, backward) step indices of each cross-entropy whose backward reads the
    forward's logits and targets with the same attributes, and whose incoming gradient is
    made before the forward runs (a graph input, a constant, or an earlier step's result).
    Each backward joins one forward at most: its result must be made once."""
    made_at = {o: n for n, st in enumerate(steps) for o in st.outputs}
    backwards = {
        (st.inputs[1], st.inputs[2]): n
        for n, st in enumerate(steps)
        if st.op == "cross_entropy_backward"
    }
    pairs = []
    for n, st in enumerate(steps):
        if st.op != "cross_entropy" or len(st.inputs) != 2:
            continue
        b = backwards.pop((st.inputs[0], st.inputs[1]), None)
        if b is None or b < n or steps[b].attrs != st.attrs:
            continue
        if made_at.get(steps[b].inputs[0], -1) < n:
            pairs.append((n, b))
    return pairs


def _only_consumer(
    steps: Sequence[Step], st: Step, uses: dict[int, int], consumer: dict[int, int]
) -> int | None:
    """The index of the one step that reads ``st``'s single output, if only one does (and
    it is no graph output)."""
    if len(st.outputs) != 1 or uses.get(st.outputs[0]) != 1:
        return None
    n = consumer.get(st.outputs[0])
    if n is None or steps[n].inputs.count(st.outputs[0]) != 1:
        return None
    return n


def matmul_batch_sum(a: Any, b: Any, out_shape: tuple[int, ...], transposed: bool) -> Any:
    """``sum over the batch of a @ b`` (a (..., K, T), b (..., T, N)) as one GEMM over the
    batch's rows, shaped ``out_shape``; ``transposed``: the (N, K) transpose, C-ordered."""
    if type(a) is not np.ndarray or type(b) is not np.ndarray:  # not a NumPy array: as written
        total = np.matmul(a, b).sum(axis=tuple(range(a.ndim - 2)))
        return (total.T if transposed else total).reshape(out_shape)
    k, n = a.shape[-2], b.shape[-1]
    a2 = np.moveaxis(a, -2, 0).reshape(k, -1)  # (K, B*T): a view when a is permute(x)
    b2 = b.reshape(-1, n)  # (B*T, N)
    dt = np.result_type(a, b)
    if transposed:
        return np.matmul(b2.T, a2.T).astype(dt, copy=False).reshape(out_shape)
    return np.matmul(a2, b2).astype(dt, copy=False).reshape(out_shape)


def matmul_transposed(a: Any, b: Any) -> Any:
    """``swapaxes(a @ b, -1, -2)`` computed as ``b^T @ a^T``: the same products, the result
    C-ordered instead of a transposed view."""
    return np.matmul(np.swapaxes(b, -1, -2), np.swapaxes(a, -1, -2))


def cross_entropy_with_grad(
    g: Any, logits: Any, target: Any, ignore_index: int, label_smoothing: float
) -> tuple[Any, Any]:
    """(``cross_entropy(logits, target)``, ``cross_entropy_backward(g, logits, target)``),
    the exponentials computed once. The common case (a batch of rows, no smoothing, no row
    ignored) runs block by block over the threads; any other runs the two kernels."""
    if (
        type(logits) is not np.ndarray
        or logits.ndim != 2
        or label_smoothing
        or not all_counted(np, target, ignore_index)
    ):
        return (
            KERNELS["cross_entropy"](logits, target, ignore_index, label_smoothing),
            KERNELS["cross_entropy_backward"](g, logits, target, ignore_index, label_smoothing),
        )
    rows, classes = logits.shape
    grad = np.empty_like(logits)
    lse = np.empty(rows, logits.dtype)
    scale = float(g) / rows
    block = max(1, CE_BLOCK_BYTES // max(1, classes * logits.itemsize))

    def rows_of(span: tuple[int, int]) -> None:
        for i in range(span[0], span[1], block):
            j = min(i + block, span[1])
            z, picks = grad[i:j], (np.arange(j - i), target[i:j])
            # the forward's z = logits - max and the backward's exp(logits - max), shared
            np.subtract(logits[i:j], logits[i:j].max(axis=-1, keepdims=True), out=z)
            picked = z[picks]
            np.exp(z, out=z)
            total = z.sum(axis=-1, keepdims=True)
            np.subtract(np.log(total[:, 0]), picked, out=lse[i:j])
            z /= total
            z[picks] -= 1
            z *= scale

    spans = shares(rows, min(threads(), -(-rows // block)))
    run_parallel(rows_of, spans, logits.size * TRANSCENDENTAL_PASSES)
    # lse.mean() as NumPy computes it (the same pairwise sum, one correctly rounded
    # division), without its Python wrapper: a third of this kernel on a digits batch
    return np.asarray(np.add.reduce(lse) / rows, dtype=logits.dtype), grad
