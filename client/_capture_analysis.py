"""The analysis half of step capture: from one recording (the graph, the live tensors
before and after the body ran, the call's arguments) decide where each graph input comes
from and where each output goes, and refuse what a replay could not repeat. `_compile`
records and replays; this module only reads what a recording saw."""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._recorder import Capture, fmt_location
from ._tensor import Tensor

if TYPE_CHECKING:
    from ._compile import Compiled, _Log
    from ._replay import _Replay

_ARG, _OBJ, _GRAD, _CONST = 0, 1, 2, 3
"""Where a graph input comes from: an argument, a state tensor, a `.grad` slot, a constant."""
_SINK_RET, _SINK_OBJ, _SINK_GRAD, _SINK_ARG = 0, 1, 2, 3
"""Where a graph output goes: the result, a state tensor, a `.grad` slot, an argument."""


class CaptureError(RuntimeError):
    """A compiled function did something a replay could not repeat; names the user's line."""


def _live_tensors(dev: Any) -> list[Tensor]:
    """Every Tensor object alive on `dev` (one pass over the collector's objects; recording
    only, never on a replay). A Tensor refers to its device, so the device's referrers hold
    them all. Not `gc.get_objects()`: its list holds every object, including a tuple that
    another thread is building from an iterator, whose resize then fails with CPython's
    SystemError ("bad argument to internal function"); local replicas run graphs on worker
    threads while the client records the next replica's step."""
    return [o for o in gc.get_referrers(dev) if type(o) is Tensor and o._dev is dev]


_WEAK_CLASH = {
    "float32": {"float16", "bfloat16", "float64"},
    "int64": {"int8", "uint8", "int32"},
}


@dataclass(slots=True)
class _Seen:
    """What one recording observed, for `_analyse`."""

    flat: list
    """The call's argument leaves."""
    journal: _Log
    start: dict[int, list[Any]]
    """Tensor id -> weak references to the objects that held it before the body ran."""
    grad_start: dict[int, Any]
    """Tensor id -> weak reference to the tensor whose `.grad` held it before the body ran."""
    arg_ids: dict[int, int]
    """Tensor id -> position of the argument leaf that held it."""
    scalar_ids: dict[int, int]
    """Tensor id of a number argument's binding -> its leaf position."""
    res_leaves: list
    res_spec: Any


def _analyse(compiled: Compiled, replay: _Replay, dev: Any, capture: Capture, seen: _Seen) -> None:
    """Fill `replay`: where each input comes from, where each output goes, the bindings,
    and the signature two recordings must share."""
    flat, journal, start, grad_start = seen.flat, seen.journal, seen.start, seen.grad_start
    arg_ids, scalar_ids, res_leaves, res_spec = (
        seen.arg_ids,
        seen.scalar_ids,
        seen.res_leaves,
        seen.res_spec,
    )
    in_pos = {i: k for k, i in enumerate(capture.input_ids)}
    out_pos = {o: j for j, o in enumerate(capture.output_ids)}
    # --- inputs
    inputs: list[tuple[int, Any, Any]] = []  # (kind, where from, spec): see _Replay.inputs
    aliases: list[tuple[Tensor, list[Tensor]]] = []
    for k, i in enumerate(capture.input_ids):
        spec_i = tuple(capture.key[0][k])
        if i in arg_ids:
            inputs.append((_ARG, arg_ids[i], spec_i))
            continue
        if i in journal.uploads:
            inputs.append((_CONST, i, spec_i))
            continue
        ref = grad_start.get(i)
        p = ref() if ref is not None else None
        if p is not None:
            inputs.append((_GRAD, p, spec_i))
            continue
        cands = [o for r in start.get(i, ()) if (o := r()) is not None]
        carrier = next((o for o in cands if o._id in out_pos), None)
        if carrier is None:  # read only: any holder; they must still agree when replayed
            holders = [o for o in cands if o._id == i]
            carrier = holders[0] if holders else None
            if len(holders) > 1:
                aliases.append((holders[0], holders[1:]))
        if carrier is None:
            raise CaptureError(
                f"compiled function {compiled.name}: input {k} of the step ({spec_i[1]}"
                f"{list(spec_i[0])}, first read at {_first_use(capture, k)}) is held by no "
                "tensor that outlives the call, so a replay could not find its next value; "
                "keep state in tensors updated in place (optimizers, _assign) or pass it as "
                "an argument"
            )
        inputs.append((_OBJ, carrier, spec_i))
    replay.inputs = inputs
    replay.aliases = aliases
    # --- outputs
    sinks: list[list[tuple[int, Any]]] = [[] for _ in capture.output_ids]
    result_leaves: list[tuple[str, Any]] = []
    result_objs = set()
    arg_leaves = {id(leaf) for leaf in flat if type(leaf) is Tensor}
    state_objs = {id(o) for refs in start.values() for r in refs if (o := r()) is not None}
    for n, leaf in enumerate(res_leaves):
        if id(leaf) in state_objs and id(leaf) not in arg_leaves:
            # a state tensor itself (`return loss, net.weight`): the call returns that very
            # object, which a replay updates like any other state (as the plain step does)
            result_leaves.append(("fixed", leaf))
            continue
        result_objs.add(id(leaf))
        if leaf._id in out_pos:
            sinks[out_pos[leaf._id]].append((_SINK_RET, n))
            result_leaves.append(("out", None))
        elif leaf._id in in_pos:
            result_leaves.append(("in", in_pos[leaf._id]))
        else:
            result_leaves.append(("fixed", leaf))
    arg_objs = {}
    for pos, leaf in enumerate(flat):
        if type(leaf) is Tensor:
            arg_objs[id(leaf)] = pos
    grad_objs = set()
    live = _live_tensors(dev)
    for o in live:
        g = o.grad
        if g is not None and g._id in out_pos and g._dev is dev:
            sinks[out_pos[g._id]].append((_SINK_GRAD, o))
            grad_objs.add(id(g))
    for o in live:
        oid = id(o)
        if o._id not in out_pos or oid in result_objs or oid in grad_objs:
            continue
        if oid in arg_objs:
            sinks[out_pos[o._id]].append((_SINK_ARG, arg_objs[oid]))
        else:
            sinks[out_pos[o._id]].append((_SINK_OBJ, o))
    del live
    replay.outputs = [(tuple(s[0]), s[1], tuple(sk)) for s, sk in zip(capture.output_specs, sinks)]
    replay.result_leaves = result_leaves
    replay.result_spec = res_spec
    # the same, laid out per kind for `run`
    replay.base_ids = [x if kind == _CONST else 0 for kind, x, _ in inputs]
    replay.obj_inputs = [(k, x, s) for k, (kind, x, s) in enumerate(inputs) if kind == _OBJ]
    replay.arg_inputs = [(k, x) for k, (kind, x, _) in enumerate(inputs) if kind == _ARG]
    replay.grad_inputs = [(k, x, s) for k, (kind, x, s) in enumerate(inputs) if kind == _GRAD]
    replay.obj_sinks = [
        (j, x) for j, (_, _, sk) in enumerate(replay.outputs) for kind, x in sk if kind == _SINK_OBJ
    ]
    replay.other_sinks = [
        (j, kind, x)
        for j, (_, _, sk) in enumerate(replay.outputs)
        for kind, x in sk
        if kind != _SINK_OBJ
    ]
    replay.result_fixups = [
        (k, kind, x) for k, (kind, x) in enumerate(result_leaves) if kind != "out"
    ]
    _plan_in_place(replay, inputs)
    # --- bindings
    slot_of: dict[int, int] = {}
    for node in capture.nodes:
        if node.op == "value":
            slot_of[node.outputs[0]] = len(slot_of)
    replay.values = list(capture.values)
    replay.actions = [(slot_of.get(tid, -1), fn) for tid, fn in journal.actions]
    replay.arg_values = [(slot_of[tid], pos) for tid, pos in scalar_ids.items() if tid in slot_of]
    bound = {s for s, _ in replay.actions if s >= 0} | {s for s, _ in replay.arg_values}
    sourceless = tuple((s, replay.values[s]) for s in range(len(replay.values)) if s not in bound)
    _check_weak_scalars(compiled, capture, scalar_ids)
    # --- what must agree between two recordings for the capture to be trusted
    replay.signature = (
        capture.key,
        tuple((k, id(x) if k in (_OBJ, _GRAD) else x if k == _ARG else 0) for k, x, _ in inputs),
        tuple(
            tuple(
                (kind, id(x) if kind == _SINK_GRAD else x if kind != _SINK_OBJ else None)
                for kind, x in sk
            )
            for _, _, sk in replay.outputs
        ),
        sourceless,
        tuple(journal.uploads[i] for i in replay.consts),
        tuple(s for s, _ in replay.actions),
        tuple(replay.arg_values),
        (res_spec, tuple(kind if kind != "in" else x for kind, x in result_leaves)),
    )


def _plan_in_place(replay: _Replay, inputs: list) -> None:
    """Which state a replay may write in place: an output whose only destination is the
    tensor object that also carries one of the step's inputs, with the same shape and dtype
    (an optimizer's parameter or moment), and that the step does not also return as it was
    before the update. The replay then stores the new value under the id that object
    already holds, so the object keeps its id (see `_Replay.run`)."""
    returned_inputs = {x for kind, x in replay.result_leaves if kind == "in"}
    carrier_of = {id(x): k for k, x, _ in replay.obj_inputs if k not in returned_inputs}
    pairs = []
    for j, (shape, dtype, sinks) in enumerate(replay.outputs):
        if len(sinks) != 1 or sinks[0][0] != _SINK_OBJ:
            continue
        x = sinks[0][1]
        k = carrier_of.get(id(x))
        if k is not None and tuple(inputs[k][2][0]) == shape and inputs[k][2][1] == dtype:
            pairs.append((j, k, x))
    written = {j for j, _, _ in pairs}
    replay.inplace_out = [j for j, _, _ in pairs]
    replay.inplace_in = [k for _, k, _ in pairs]
    replay.holders = [x for _, _, x in pairs]
    replay.ones = [1] * len(pairs)
    replay.fresh_out = [j for j in range(len(replay.outputs)) if j not in written]
    replay.obj_sinks_rest = [(j, x) for j, x in replay.obj_sinks if j not in written]
    replay.obj_holders = [x for _, x, _ in replay.obj_inputs]
    replay.same_holders = len(replay.holders) == len(replay.obj_holders) and all(
        a is b for a, b in zip(replay.holders, replay.obj_holders)
    )  # (the usual step: each state object read is the one written, in the same order)
    replay.seen_obj_ids = None
    replay.seen_hold_ids = None


def _first_use(capture: Capture, k: int) -> str:
    for n, (_, ins, _, _) in zip(capture.nodes, capture.key[1]):
        if k in ins:
            return fmt_location(n.where)
    return "<unknown>"


def _check_weak_scalars(compiled: Compiled, capture: Capture, scalar_ids: dict[int, int]) -> None:
    """A Python number argument arrives as a float32/int64 0-d tensor. Next to a tensor of
    another width of the same kind it would widen the result, where the number itself would
    have adopted the tensor's dtype: refuse rather than compute something else."""
    if not scalar_ids:
        return
    dtype_of: dict[int, str] = {}
    for i, s in zip(capture.input_ids, capture.key[0]):
        dtype_of[i] = s[1]
    for n in capture.nodes:
        for o, s in zip(n.outputs, n.specs):
            dtype_of[o] = s[1]
    for n in capture.nodes:
        weak = [i for i in n.inputs if i in scalar_ids]
        if not weak:
            continue
        for w in weak:
            clash = _WEAK_CLASH.get(dtype_of[w], set())
            for i in n.inputs:
                if i not in scalar_ids and dtype_of.get(i) in clash:
                    raise CaptureError(
                        f"compiled function {compiled.name}: scalar argument {scalar_ids[w]} "
                        f"arrives as a 0-d {dtype_of[w]} tensor and meets a {dtype_of[i]} tensor "
                        f"in {n.op} at {fmt_location(n.where)}, which would change the result's "
                        f"dtype; pass dev.scalar(value, {dtype_of[i]!r}) instead"
                    )
