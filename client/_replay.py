"""A captured step's replay: bind the call's arguments and the state it read, check the
guards that cannot be checked from the call's signature alone (the state's identity, shapes
and versions), and hand the recorder one Capture per call -- the hot path of `br.compile`.
`_compile` decides when to replay; `_capture_analysis` lays out the per-kind lists this
replay walks."""

from __future__ import annotations

from collections.abc import Callable
from itertools import islice
from operator import attrgetter
from typing import Any

from ._capture_analysis import _SINK_GRAD, _SINK_RET
from ._recorder import Capture, Recorder
from ._tensor import Tensor, make_tensor

_LEAF = "*"
"""An argument or result tree's leaf (a tensor or a number), in its structure spec."""

_ID = attrgetter("_id")

Spec = tuple[tuple[int, ...], str]
"""A tensor's (shape, dtype)."""


class _Miss(Exception):
    """A replay's guard failed; the message says why (logged at debug level)."""


def _unflatten(spec: Any, leaves: list, at: list[int]) -> Any:
    if spec == _LEAF:
        at[0] += 1
        return leaves[at[0] - 1]
    kind = spec[0]
    if kind == "=":
        return spec[1]
    if kind is dict:
        return {k: _unflatten(s, leaves, at) for k, s in zip(spec[1], spec[2])}
    items = [_unflatten(s, leaves, at) for s in spec[1]]
    return kind(*items) if hasattr(kind, "_fields") else kind(items)


class _Replay:
    """Everything a replay needs: the graph, where each input comes from and each output
    goes, the bindings and their sources, how to rebuild the result."""

    __slots__ = (
        "template",
        "inputs",
        "values",
        "actions",
        "arg_values",
        "outputs",
        "result_spec",
        "result_leaves",
        "consts",
        "signature",
        "rec",
        "dev",
        "aliases",
        "base_ids",
        "obj_inputs",
        "arg_inputs",
        "grad_inputs",
        "obj_sinks",
        "other_sinks",
        "result_fixups",
        "inplace_out",
        "inplace_in",
        "holders",
        "ones",
        "fresh_out",
        "obj_sinks_rest",
        "obj_holders",
        "same_holders",
        "seen_obj_ids",
        "seen_ids",
        "seen_hold_ids",
        "seen_out_ids",
        "hold_set",
    )

    template: Capture
    inputs: list[tuple[int, Any, Spec]]
    """Per graph input: (kind, where from: a Tensor, an argument position or an id, spec)."""
    values: list[Any]
    actions: list[tuple[int, Callable[[], Any]]]
    arg_values: list[tuple[int, int]]
    outputs: list[tuple[tuple[int, ...], str, tuple[tuple[int, Any], ...]]]
    """Per graph output: (shape, dtype, its sinks as (kind, where to))."""
    result_spec: Any
    result_leaves: list[tuple[str, Any]]
    consts: list[int]
    signature: tuple[Any, ...]
    rec: Recorder
    dev: Any
    aliases: list[tuple[Tensor, list[Tensor]]]
    base_ids: list[int]
    obj_inputs: list[tuple[int, Tensor, Spec]]
    arg_inputs: list[tuple[int, int]]
    grad_inputs: list[tuple[int, Tensor, Spec]]
    obj_sinks: list[tuple[int, Tensor]]
    other_sinks: list[tuple[int, int, Any]]
    result_fixups: list[tuple[int, str, Any]]
    inplace_out: list[int]
    inplace_in: list[int]
    holders: list[Tensor]
    ones: list[int]
    fresh_out: list[int]
    obj_sinks_rest: list[tuple[int, Tensor]]
    obj_holders: list[Tensor]
    same_holders: bool
    seen_obj_ids: list[int] | None
    seen_ids: list[int]
    seen_hold_ids: list[int] | None
    seen_out_ids: list[int]
    hold_set: set[int]

    def release(self) -> None:
        """Give back the constants this capture kept alive (uploads inside the body)."""
        for i in self.consts:
            self.rec.release(i)
        self.consts = []

    def run(self, flat: list) -> Any:
        """Bind this call's arguments and the state's current tensors, write the state in
        place (or rebind it to new ids), submit the graph; the result, rebuilt. The hot path
        of a step: the per-kind lists below were laid out by `_analyse` so this is a few flat
        loops, and while the state keeps its ids from call to call, none of them per state.

        State is written in place when each object that receives an output is the only
        Tensor holding its id (no alias, no tape entry of another object): the graph's output
        is stored under that same id, so the object keeps it and its version is bumped (a
        tape that saved it refuses to run, as after `_assign`). Otherwise the object takes a
        new id, as an uncaptured step's `_assign` does: an alias keeps the old value."""
        x: Any  # (loop names reused below for a tensor, an id or a position)
        o: Any
        kind: Any
        rec = self.rec
        if rec.pending:  # ops recorded before the call run first: they may read the state
            rec.flush()
        specs = rec.specs
        obj_ids = list(map(_ID, self.obj_holders))
        if obj_ids == self.seen_obj_ids:  # the same state tensors as last call: checked then
            ids = self.seen_ids[:]
        else:
            ids = self.base_ids[:]
            for k, x, spec in self.obj_inputs:
                i = x._id
                now = specs.get(i)
                if now is not spec and now != spec:  # replays store the template's own spec
                    raise _Miss(_state_changed(x, spec, now))
                ids[k] = i
            self.seen_obj_ids, self.seen_ids = obj_ids, ids[:]
        bound = []
        for k, pos in self.arg_inputs:
            i = ids[k] = flat[pos]._id
            bound.append(i)
        for k, x, spec in self.grad_inputs:
            g = x.grad
            if g is None:
                raise _Miss(
                    f"the .grad of a {x.shape} {x.dtype} tensor was read when captured and "
                    "is None now"
                )
            i = ids[k] = g._id
            if specs.get(i) != spec:
                raise _Miss(_state_changed(g, spec, specs.get(i)))
            bound.append(i)
        for held, others in self.aliases:
            for o in others:
                if o._id != held._id:
                    raise _Miss(
                        "two tensors that held the same state when captured now hold "
                        "different values (one was replaced): capturing which one the step reads"
                    )
        values = self.values[:]
        for slot, source in self.actions:
            v = source()
            if slot >= 0:
                values[slot] = v
        for slot, pos in self.arg_values:
            values[slot] = flat[pos]
        refs = rec.refs
        holders = self.holders
        in_place = False
        if holders:
            hold_ids = obj_ids if self.same_holders else list(map(_ID, holders))
            if hold_ids != self.seen_hold_ids:
                self.seen_hold_ids, self.hold_set = hold_ids, set(hold_ids)
                out = [0] * len(self.outputs)
                for j, i in zip(self.inplace_out, hold_ids):
                    out[j] = i
                self.seen_out_ids = out
            # sole holders (refs 1), and no argument or gradient bound to the same tensor
            in_place = list(map(refs.get, hold_ids)) == self.ones and (
                not bound or self.hold_set.isdisjoint(bound)
            )
        tmpl = self.template
        if in_place:
            out_ids = self.seen_out_ids[:]
            fresh = self.fresh_out
            for j, o in zip(fresh, islice(rec._ids, len(fresh))):
                out_ids[j] = o
            for x in holders:
                x._version += 1  # a tape that saved it refuses to run, as after _assign
            obj_sinks = self.obj_sinks_rest
        else:
            out_ids = list(islice(rec._ids, len(self.outputs)))
            obj_sinks = self.obj_sinks
        cap = Capture(
            tmpl.key, tmpl.digest, tmpl.nodes, ids, values, out_ids, tmpl.output_specs, tmpl._graph
        )
        cap.prov = tmpl.prov
        cap.step = True  # a runtime that paces compiled steps counts it (``step_done``)
        if in_place:
            cap.inplace = self.inplace_in
        dead, failed = rec.dead, rec.failed
        for j, x in obj_sinks:  # state written: the holder takes the new id (as _assign)
            o = out_ids[j]
            refs[o] = refs.get(o, 0) + 1
            old = x._id
            n = refs.get(old, 0) - 1
            if n > 0:
                refs[old] = n
            else:  # what Recorder.release does
                refs.pop(old, None)
                if old in specs:
                    dead.append(old)
                if failed:
                    failed.pop(old, None)
            x._id = o
            x._version += 1  # a tape that saved it refuses to run, as after _assign
        dev = self.dev
        returned: list[Any] = [None] * len(self.result_leaves)
        for j, kind, x in self.other_sinks:
            o = out_ids[j]
            shape, dtype = self.outputs[j][:2]
            if kind == _SINK_RET:
                returned[x] = make_tensor(dev, o, shape, dtype)
            elif kind == _SINK_GRAD:
                x.grad = make_tensor(dev, o, shape, dtype)
            else:  # an argument the body assigned to
                t = flat[x]
                rec.retain(o)
                rec.release(t._id)
                t._id = o
                t._version += 1
        if not all(map(refs.__contains__, ids)):
            cap.donated = [k for k, i in enumerate(ids) if i not in refs]
        try:
            rec.submit(cap)
        except BaseException:  # the state it wrote in place is gone: check it next call
            self.seen_obj_ids = None
            raise
        for k, kind, x in self.result_fixups:
            if kind == "in":
                shape, dtype = tmpl.key[0][x]
                returned[k] = make_tensor(dev, ids[x], shape, dtype)
            else:
                returned[k] = x
        if self.result_spec == _LEAF:
            return returned[0]
        return _unflatten(self.result_spec, returned, [0])


def _state_changed(t: Tensor, spec: Any, now: Any) -> str:
    if now is None:
        return f"a state tensor of shape {spec[0]} ({spec[1]}) the capture read no longer exists on the device"
    return f"a state tensor the capture read changed from {spec[1]}{list(spec[0])} to {now[1]}{list(now[0])}"
