"""Elementwise fusion for compiled plans: chains of table ops become one generated kernel.

A cached graph is compiled once, so it pays to merge every run of elementwise steps whose
intermediate results nothing else reads into a single kernel: the intermediates then live
in registers, never in device memory, and a training step launches far fewer kernels. The
pass is target-neutral: it groups steps and describes each group as a `FusedProgram`; a
backend turns a program into a kernel (CuPy: `ElementwiseKernel`; OpenCL: the strided
kernel of opencl_codegen), both spelling the ops from the one expression table (cexpr).

Intermediates of narrow float dtypes (float16, bfloat16) are not fused through, so a fused
kernel rounds exactly where the unfused steps would.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .backends import cexpr
from .executor import Plan, Step

FUSABLE_DTYPES = frozenset({"bool", "int8", "uint8", "int32", "int64", "float32", "float64"})
"""Dtypes an intermediate may have inside a fused kernel (its compute type is its storage)."""


@dataclass(frozen=True)
class FusedProgram:
    """A fused group: `inputs` are the external operands' dtypes (kernel arguments in order);
    each instruction is (op, operand refs, result dtype), a ref being ("in", k) or
    ("t", j) for instruction j; the last instruction's result is the kernel's output."""

    inputs: tuple[str, ...]
    instructions: tuple[tuple[str, tuple[tuple[str, int], ...], str], ...]

    @property
    def out_dtype(self) -> str:
        return self.instructions[-1][2]

    def body(self, ctypes: Mapping[str, str], operand: Callable[[int], str]) -> list[str]:
        """C statements computing t0..tN; `operand(k)` spells external input k and
        `ctypes` spells each dtype's compute type in the target language."""
        lines = []
        for j, (op, refs, out) in enumerate(self.instructions):
            in_dt = tuple(
                self.inputs[k] if kind == "in" else self.instructions[k][2] for kind, k in refs
            )
            comp = cexpr.compute_dtype(op, in_dt, out)
            args = tuple(
                f"(({ctypes[c]})({operand(k) if kind == 'in' else f't{k}'}))"
                for (kind, k), c in zip(refs, comp)
            )
            c = comp[-1] if op == "where" else comp[0]
            expr = cexpr.expression(op, c, ctypes[c], args)
            lines.append(f"{ctypes[_widen(out)]} t{j} = ({ctypes[_widen(out)]})({expr});")
        return lines


def _widen(dtype: str) -> str:
    return "float32" if dtype in ("float16", "bfloat16") else dtype


def slot_shapes(plan: Plan) -> list[tuple[int, ...]]:
    """The shape of every slot of a plan, from its graph."""
    out = [tuple(shape) for shape, _ in plan.graph.inputs]
    for node in plan.graph.nodes:
        out.extend(tuple(shape) for shape, _ in node.outputs)
    return out


def slot_dtypes(plan: Plan) -> list[str]:
    """The dtype of every slot of a plan, from its graph."""
    out = [d for _, d in plan.graph.inputs]
    for node in plan.graph.nodes:
        out.extend(d for _, d in node.outputs)
    return out


def fuse_plan(plan: Plan, make_kernel: Callable[[FusedProgram], Any], min_ops: int = 2) -> Plan:
    """Replace each group of at least `min_ops` fusable steps by one step running
    `make_kernel(program)`; everything else (order, releases of other slots) is kept."""
    slot_dt = slot_dtypes(plan)
    uses: dict[int, int] = {}
    for st in plan.steps:
        for i in st.inputs:
            uses[i] = uses.get(i, 0) + 1
    outputs = set(plan.outputs)
    producer: dict[int, int] = {}  # slot -> index of the step that makes it
    group_of: dict[int, list[int]] = {}  # root step index -> member step indices (ordered)
    absorbed: set[int] = set()
    for n, st in enumerate(plan.steps):
        if not _fusable(st, slot_dt):
            continue
        members = [n]
        for i in st.inputs:
            p = producer.get(i)
            if (
                p is not None
                and p not in absorbed
                and uses.get(i) == 1
                and i not in outputs
                and slot_dt[i] in FUSABLE_DTYPES
            ):
                members = group_of.pop(p) + members
                absorbed.add(p)
        group_of[n] = sorted(members)
        producer[st.outputs[0]] = n
    steps: list[Step] = []
    for n in range(len(plan.steps)):
        if n in absorbed:
            continue
        group = group_of.get(n)
        if group is None or len(group) < min_ops:
            steps.extend(plan.steps[m] for m in (group or [n]))
            continue
        steps.append(_fused_step(plan, group, slot_dt, make_kernel))
    return with_steps(plan, steps)


def with_steps(plan: Plan, steps: list[Step]) -> Plan:
    """A new plan of the same graph running ``steps`` (a rewrite of ``plan.steps``), with each
    slot's release and the liveness recomputed for the new order."""
    release_after_last_use(steps, set(plan.outputs))
    new = Plan(
        plan.graph, steps, plan.n_slots, plan.n_inputs, plan.value_slots, plan.constants,
        plan.outputs,
    )  # fmt: skip
    new.liveness = plan_liveness(new)
    return new


def _fusable(st: Step, slot_dt: list[str]) -> bool:
    return st.op in cexpr.FUSABLE and len(st.outputs) == 1


def _fused_step(
    plan: Plan, members: list[int], slot_dt: list[str], make_kernel: Callable[[FusedProgram], Any]
) -> Step:
    made: dict[int, int] = {}  # slot -> instruction index
    external: list[int] = []
    instructions = []
    for m in members:
        st = plan.steps[m]
        refs = []
        for i in st.inputs:
            if i in made:
                refs.append(("t", made[i]))
            else:
                if i not in external:
                    external.append(i)
                refs.append(("in", external.index(i)))
        instructions.append((st.op, tuple(refs), slot_dt[st.outputs[0]]))
        made[st.outputs[0]] = len(instructions) - 1
    program = FusedProgram(tuple(slot_dt[i] for i in external), tuple(instructions))
    root = plan.steps[members[-1]]
    return Step(
        node=root.node,
        op="fused:" + "+".join(plan.steps[m].op for m in members),
        kernel=make_kernel(program),
        inputs=tuple(external),
        outputs=root.outputs,
        attrs={},
        dtypes=root.dtypes,
        release=(),  # set by release_after_last_use
    )


def release_after_last_use(steps: list[Step], kept: set[int]) -> None:
    """Recompute every step's release list: a fused step runs where its last member ran,
    so an operand an earlier member shared with a step in between now dies later."""
    last: dict[int, int] = {}
    for n, st in enumerate(steps):
        for i in st.inputs:
            last[i] = n
    releases: dict[int, list[int]] = {}
    for s, n in last.items():
        if s not in kept:
            releases.setdefault(n, []).append(s)
    for n, st in enumerate(steps):
        st.release = tuple(releases.get(n, ()))


def plan_liveness(plan: Plan) -> list[tuple[int, int, int]]:
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for n, st in enumerate(plan.steps):
        for i in st.inputs:
            last[i] = n
        for o in st.outputs:
            first[o] = n
    end = len(plan.steps)
    kept = set(plan.outputs)
    return [
        (s, first.get(s, -1), end if s in kept else last.get(s, first.get(s, -1)))
        for s in range(plan.n_slots)
    ]
