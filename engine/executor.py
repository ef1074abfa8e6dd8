"""Compiles a graph once into a plan and replays the plan: the one engine both ends use.

A plan is a flat list of steps (kernel, operand slots, attributes) in topological order,
with each slot released after its last use, so intermediates die as early as the graph
allows. Plans are cached by graph hash in a bounded LRU shared by every caller.
"""

from __future__ import annotations

import math
import sys
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import numpy as np

from ..protocol import dtypes
from ..protocol.graph import Graph, GraphError
from ..protocol.ops import COLLECTIVE
from ..protocol.registry import OPS
from . import preempt
from .backend_base import Backend

CONSTANT_CACHE_BYTES = 1 << 20
"""A `full` node up to this size is made once at compile time and kept with the plan; a
larger one is made by each run (``FreshConstant``): a cached plan would otherwise hold it for
as long as the plan lives (an optimizer's first step holds zeros as large as the model's
moments: 944 MiB for GPT-2 small), and a run's own array may take a kernel's result."""

PLAN_CACHE_SIZE = 256
"""Compiled plans kept per executor; the least recently used is evicted past this."""


class ExecutionError(RuntimeError):
    """A kernel failed; names the node index and op so the client can point at the user's line."""

    def __init__(self, message: str, node: int, op: str) -> None:
        super().__init__(message)
        self.node = node
        self.op = op


@dataclass(frozen=True, slots=True)
class FreshConstant:
    """A `full` node too large to keep with its plan: each run makes it anew."""

    kernel: Any
    attrs: dict[str, Any]

    def make(self) -> Any:
        return self.kernel(**self.attrs)


@dataclass(slots=True)
class Step:
    node: int
    op: str
    kernel: Any
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    attrs: dict[str, Any]
    dtypes: tuple[Any, ...]
    release: tuple[int, ...]
    """Slots whose last use is this step: dropped right after it runs."""
    write_into: tuple[int, ...] = ()
    """Input slots the kernel may write its results into (``Backend.writes_into``), passed
    as ``out=``: one per output for a multi-output kernel (all or none), candidates for a
    single output (the first that may be written). A run writes into a slot only if nothing
    else holds its array and, for a graph input, the caller donated it (``_writable_out``);
    empty: the kernel always makes new arrays."""


@dataclass(slots=True)
class Plan:
    graph: Graph
    steps: list[Step]
    n_slots: int
    n_inputs: int
    value_slots: list[tuple[int, str]]
    constants: list[tuple[int, Any]]
    """(slot, array) of `full` nodes, computed once at compile time and shared by every
    replay (kernels never write them: the slot list is not their only holder); a larger one
    than CONSTANT_CACHE_BYTES is a FreshConstant, made by each run."""
    outputs: tuple[int, ...]
    liveness: list[tuple[int, int, int]] = field(default_factory=list)
    """(slot, first step, last step) of every slot; memory planning reads it."""
    seconds: float | None = None
    """Wall time of the last run (set by whoever runs it: the server judges from it whether
    a replay may run on its network loop)."""
    runs: int = 0
    """Executions so far; the first is the dry run that GPU pools size their pages from."""
    peak_bytes: int = 0
    """Most bytes of intermediates alive at once (from declared shapes; set by the server,
    which reserves them in its memory ledger for each run)."""
    output_bytes: int | None = None
    """Bytes of the outputs from their declared shapes (set by the server with
    ``peak_bytes``; None: not known, so a run of replays is not reserved ahead)."""
    input_bytes: list[int] | None = None
    """Bytes of each input from its declared shape (made on first use by the server)."""
    collective: bool = False
    """The graph has a collective op: a run waits for other ranks, so it never runs on a
    server's network loop (that loop moves the collective's bytes)."""
    input_check: tuple[list[tuple[int, ...]], list[Any]] | None = None
    """(shapes, NumPy dtypes) of the inputs, made on first use: a replay checks what it is
    bound to with two list comparisons instead of Python per input (``input_check``)."""
    operands: list[Callable[[list[Any]], Sequence[Any]]] | None = None
    """Per step, what takes its operands from the slot list (``_operand_getters``), made on
    first run."""


def _operand_getters(plan: Plan) -> list[Callable[[list[Any]], Sequence[Any]]]:
    """Per step, an ``itemgetter`` of its operand slots: one C call per step, where a list
    comprehension is a Python frame (a quarter of a small step's executor time). One operand
    is taken as a one-item slice, so every getter returns a sequence."""
    getters: list[Callable[[list[Any]], Sequence[Any]]] = []
    for step in plan.steps:
        ins = step.inputs
        if len(ins) == 1:
            getters.append(itemgetter(slice(ins[0], ins[0] + 1)))
        elif ins:
            getters.append(itemgetter(*ins))
        else:
            getters.append(itemgetter(slice(0, 0)))
    plan.operands = getters
    return getters


def input_check(plan: Plan) -> tuple[list[tuple[int, ...]], list[Any]]:
    """The plan's input shapes and dtypes, as lists an execution's inputs compare with."""
    if plan.input_check is None:
        ins = plan.graph.inputs
        plan.input_check = (
            [tuple(shape) for shape, _ in ins],
            [dtypes.to_numpy(dt) for _, dt in ins],
        )
    return plan.input_check


def compile_graph(graph: Graph, backend: Backend) -> Plan:
    """Order is already topological (recording order); compute kernels, liveness, releases.

    GPU backends compile on their device and stream (`activate`), and the constants are
    waited for before the plan is returned: plans are shared by sessions that run on other
    streams, which must never read a constant that is still being written.
    """
    if not backend.activates:
        return _compile(graph, backend)
    with backend.activate():
        plan = _compile(graph, backend)
        if plan.constants:
            backend.synchronize()
    return plan


def _compile(graph: Graph, backend: Backend) -> Plan:
    n_inputs = len(graph.inputs)
    slot = n_inputs
    steps: list[Step] = []
    value_slots: list[tuple[int, str]] = []
    constants: list[tuple[int, Any]] = []
    first_use: dict[int, int] = {i: -1 for i in range(n_inputs)}
    last_use: dict[int, int] = {}
    kept = set(graph.outputs)
    pending: list[tuple[int, Any, tuple[int, ...], tuple[int, ...]]] = []
    for index, node in enumerate(graph.nodes):
        outs = tuple(range(slot, slot + len(node.outputs)))
        slot += len(node.outputs)
        if node.op == "full":
            attrs = OPS["full"].bind_attrs(dict(node.attrs))
            size = math.prod(attrs["shape"]) * dtypes.to_numpy(attrs["dtype"]).itemsize
            full = backend.kernels["full"]
            made = full(**attrs) if size <= CONSTANT_CACHE_BYTES else FreshConstant(full, attrs)
            constants.append((outs[0], made))
            first_use[outs[0]] = -1
            continue
        if node.op == "value":
            value_slots.append((outs[0], node.outputs[0][1]))
            for o in outs:
                first_use[o] = -1
            continue
        kernel = backend.kernels.get(node.op)
        if kernel is None:
            raise GraphError(
                f"node {index}: backend {backend.name} has no kernel for {node.op!r}", index
            )
        step_no = len(steps)
        for i in node.inputs:
            last_use[i] = step_no
        for o in outs:
            first_use[o] = step_no
        pending.append((index, kernel, tuple(node.inputs), outs))
        op = OPS[node.op]
        steps.append(
            Step(
                node=index,
                op=node.op,
                kernel=kernel,
                inputs=tuple(node.inputs),
                outputs=outs,
                attrs=op.bind_attrs(dict(node.attrs)),
                dtypes=tuple(dtypes.to_numpy(d) for _, d in node.outputs),
                release=(),
            )
        )
    releases: dict[int, list[int]] = {}
    for s, last in last_use.items():
        if s not in kept:
            releases.setdefault(last, []).append(s)
    for i, step in enumerate(steps):
        step.release = tuple(releases.get(i, ()))
    liveness = [
        (
            s,
            first_use.get(s, -1),
            last_use.get(s, len(steps) if s in kept else first_use.get(s, -1)),
        )
        for s in range(slot)
    ]
    plan = Plan(
        graph, steps, slot, n_inputs, value_slots, constants, tuple(graph.outputs), liveness
    )
    plan.collective = any(step.op in COLLECTIVE for step in steps)
    # a backend may rewrite the plan once per compiled graph (GPU backends fuse elementwise
    # chains into generated kernels; engine/fusion.py)
    collective = plan.collective
    plan = backend.optimize_plan(plan)
    plan.collective = collective  # a rewritten plan still waits for its ranks
    if backend.writes_into:
        _mark_in_place(plan, backend.writes_into)
    return plan


def _mark_in_place(plan: Plan, writes_into: Mapping[str, tuple[int, ...]]) -> None:
    """Set ``write_into`` of the steps whose kernel may write into its inputs: inputs this
    step reads once and last, of the output's declared shape and dtype for a one-output step
    (whose operands must all have that dtype: the kernel then computes exactly as before)."""
    shapes = [tuple(shape) for shape, _ in plan.graph.inputs]
    dts = [dt for _, dt in plan.graph.inputs]
    for node in plan.graph.nodes:
        shapes.extend(tuple(shape) for shape, _ in node.outputs)
        dts.extend(dt for _, dt in node.outputs)
    for step in plan.steps:
        into = writes_into.get(step.op)
        if into is None or any(k >= len(step.inputs) for k in into):
            continue
        slots = tuple(step.inputs[k] for k in into)
        dying = [s in step.release and step.inputs.count(s) == 1 for s in slots]
        if len(step.outputs) > 1:  # each output into its own input, or none
            if len(slots) == len(step.outputs) and all(dying):
                step.write_into = slots
            continue
        out = step.outputs[0]
        if any(dts[i] != dts[out] for i in step.inputs):
            continue
        step.write_into = tuple(s for s, d in zip(slots, dying) if d and shapes[s] == shapes[out])


class Executor:
    """Runs graphs on one backend with a bounded cache of compiled plans."""

    def __init__(self, backend: Backend, cache_size: int = PLAN_CACHE_SIZE) -> None:
        self.backend = backend
        self.cache_size = cache_size
        self._plans: OrderedDict[str, Plan] = OrderedDict()
        self.compiled = 0
        self.replays = 0
        self.memory: Any = None
        """Hook (engine.memory.GraphMemory): when set, every result lives in a pool or arena
        block; None keeps the kernels' own arrays."""

    def plan(self, digest: str) -> Plan | None:
        plan = self._plans.get(digest)
        if plan is not None:
            self._plans.move_to_end(digest)
        return plan

    def register(self, digest: str, graph: Graph) -> Plan:
        return self.add(digest, compile_graph(graph, self.backend))

    def add(self, digest: str, plan: Plan) -> Plan:
        """Cache a plan compiled beforehand (``compile_graph``), so a caller can compile a
        large graph without holding whatever lock guards the cache."""
        self._plans[digest] = plan
        self._plans.move_to_end(digest)
        self.compiled += 1
        while len(self._plans) > self.cache_size:
            self._plans.popitem(last=False)
        return plan

    def evict(self, digest: str) -> None:
        """Drop a cached plan (and the constants it holds)."""
        self._plans.pop(digest, None)

    def __contains__(self, digest: str) -> bool:
        return digest in self._plans

    def run(
        self,
        plan: Plan,
        inputs: Sequence[Any],
        values: Sequence[Any],
        donated: Sequence[int] = (),
    ) -> list[Any]:
        """Execute a plan; returns the arrays of the graph's outputs in order.

        `donated` lists input positions whose caller has let go of them (an optimizer's old
        parameters and moments): their memory is freed at their last use inside the graph,
        so the step's results can take it instead of adding to the peak.
        """
        if not self.backend.activates:
            return self._run(plan, inputs, values, donated)
        with self.backend.activate(
            plan
        ):  # GPU backends: the session's device and stream (and dry run)
            return self._run(plan, inputs, values, donated)

    def _run(
        self, plan: Plan, inputs: Sequence[Any], values: Sequence[Any], donated: Sequence[int]
    ) -> list[Any]:
        self.replays += 1
        plan.runs += 1
        slots: list[Any] = [None] * plan.n_slots
        slots[: plan.n_inputs] = inputs
        backend = self.backend
        for s, array in plan.constants:
            slots[s] = array.make() if type(array) is FreshConstant else array
        for (s, dt), v in zip(plan.value_slots, values, strict=True):
            slots[s] = backend.scalar(v, dt)
        conform = backend.conform
        array_type: Any = backend.array_type  # results of this type and dtype skip conform
        mem = self.memory.run(plan) if self.memory is not None else None
        if mem is not None:
            for i in donated:
                mem.donate(i, slots[i])
        in_place = mem is None  # pooled memory places every result itself
        donated_set = frozenset(donated)
        n_inputs = plan.n_inputs
        result: Any = None
        check = preempt.current()  # a server's engine turn may give way between steps
        operands = plan.operands or _operand_getters(plan)
        for step, get in zip(plan.steps, operands):
            try:
                if step.write_into and in_place:
                    result = None  # the last result's array is in its slot: no extra reference
                    out = _writable_out(step, slots, n_inputs, donated_set)
                    if out is not None:
                        result = step.kernel(*get(slots), out=out, **step.attrs)
                    else:
                        result = step.kernel(*get(slots), **step.attrs)
                else:
                    result = step.kernel(*get(slots), **step.attrs)
            except Exception as exc:  # a kernel failure becomes a located error
                if mem is not None:
                    mem.abort()
                raise ExecutionError(
                    f"{step.op}: {type(exc).__name__}: {exc}", step.node, step.op
                ) from exc
            if len(step.outputs) == 1:
                dt = step.dtypes[0]
                if type(result) is not array_type or result.dtype != dt:
                    result = conform(result, dt)
                slots[step.outputs[0]] = result
            else:
                for s, r, dt in zip(step.outputs, result, step.dtypes):
                    slots[s] = conform(r, dt)
            if mem is not None:
                _place(mem, step, slots)
            for s in step.release:
                slots[s] = None
            if check is not None:
                check()
        if mem is not None:
            return mem.finish([slots[s] for s in plan.outputs])
        return [slots[s] for s in plan.outputs]


def _refs_of(held: list[Any], s: int) -> int:
    """``sys.getrefcount`` of ``held[s]``, always asked through this one call, so the count
    of an array held by one list alone is measured once (``_HELD_ONCE``) rather than assumed:
    interpreters count a call's own references differently."""
    return sys.getrefcount(held[s])


_HELD_ONCE = _refs_of([np.empty(1)], 0)


def _writable_out(
    step: Step, slots: list[Any], n_inputs: int, donated: frozenset[int]
) -> tuple[Any, ...] | None:
    """The arrays a step may write its outputs into (``Step.write_into``): an input array
    that owns its memory (no view of another array), is writeable, and is held by nothing but
    the run (no view of it, no reader's reference: a caller that kept an array a device
    handed out still sees its old values), and is a graph input only if the caller donated
    it. None: the kernel makes new arrays."""
    if len(step.outputs) > 1:
        if all(_unshared(slots, s, n_inputs, donated) for s in step.write_into):
            return tuple(slots[s] for s in step.write_into)
        return None
    for s in step.write_into:
        if _unshared(slots, s, n_inputs, donated):
            return (slots[s],)
    return None


def _unshared(slots: list[Any], s: int, n_inputs: int, donated: frozenset[int]) -> bool:
    """Whether ``slots[s]`` may be overwritten: held by the slot list alone (and, for a graph
    input, the caller's ``inputs`` sequence, which donated it)."""
    a = slots[s]
    if type(a) is not np.ndarray or a.base is not None or not a.flags.writeable:
        return False
    del a
    if s < n_inputs:
        return s in donated and _refs_of(slots, s) <= _HELD_ONCE + 1
    return _refs_of(slots, s) <= _HELD_ONCE


def _place(mem: Any, step: Step, slots: list[Any]) -> None:
    """Move a step's results into memory blocks. Dying inputs are released first so their
    bytes can take the results (in-place reuse), unless a multi-output step's results may
    still view them."""
    early = len(step.outputs) == 1 or not any(
        slots[r] is not None and np.may_share_memory(slots[o], slots[r])
        for o in step.outputs
        for r in step.release
    )
    if early:
        for s in step.release:
            mem.release(s)
    for s in step.outputs:
        slots[s] = mem.place(s, slots[s])
    if not early:
        for s in step.release:
            mem.release(s)
