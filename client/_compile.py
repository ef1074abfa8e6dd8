"""Step capture: `compile(fn)` records a step once, then replays it by binding new arguments.

Recording stays the way a graph is made (a device's pending ops, `_recorder`); capture sits
above it, as tinygrad's TinyJit and jax.jit do. A compiled function's first calls run its body
while recording; once two recordings in a row agree (same graph, same state, same constant
values), later calls check a guard and replay: argument tensors are bound to the graph's
inputs, state (parameters, gradients, optimizer moments) is read from and written back to the
same Tensor objects, outputs come back as lazy tensors, and the body does not run.

What changes from call to call without being a tensor reaches the graph as a *binding with a
source*: `binding(dev, fn, dtype)` records `fn()` now and calls `fn` again on every replay
(learning-rate schedules, Adam's bias corrections, dropout keys), and `on_replay(fn)` re-runs
a host-side effect (an optimizer's step counter), all in recording order, so step N replayed
equals step N recorded bit for bit. Python ints and floats passed as arguments become 0-d
tensors whose values are bindings (changing them never re-captures).

A recording finds the state by looking at every live Tensor of the device before and after
the body ran: an object whose id was a graph input is state read, one whose id is now a graph
output is state written (an optimizer's `_assign`), a tensor's `.grad` that held an input or
holds an output is a gradient slot. Anything that would make a replay differ from running the
body fails loudly with the user's line: reading a tensor (item, numpy, a branch on a value),
ops on another device, data uploaded inside that changes, constants that change.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import sys
import weakref
from collections import OrderedDict
from collections.abc import Callable
from threading import Lock, get_ident
from types import FrameType
from typing import Any

import numpy as np

from . import _autograd
from ._bindings import binding, capturing, on_replay  # noqa: F401 (public here)
from ._capture_analysis import (  # noqa: F401 (CaptureError is public here)
    _CONST,
    _GRAD,
    _OBJ,
    _SINK_GRAD,
    _SINK_OBJ,
    _SINK_RET,
    CaptureError,
    _analyse,
    _live_tensors,
    _Seen,
)
from ._recorder import CAPTURING, capture_here, epoch, fmt_location, user_location
from ._replay import _LEAF, _Miss, _Replay, _unflatten
from ._tensor import Tensor

log = logging.getLogger("burn_remote.compile")

MAX_CAPTURES = 8
"""Captures kept per compiled function (one per argument signature), least recent evicted."""
MAX_RECORDINGS = 4
"""Recordings of one signature that may disagree before the function is declared uncapturable."""


# --- argument and result trees ------------------------------------------------------------------
_UNBOUND = object()
"""`bound` of a plain function call (a compiled method passes its instance)."""


def _flatten(obj: Any, leaves: list, path: str) -> Any:
    """A hashable structure of `obj` with tensors and Python numbers taken out as leaves;
    bools, None and strings stay in the structure (a change re-captures)."""
    t = type(obj)
    if t is Tensor or t is float or t is int:
        leaves.append(obj)
        return _LEAF
    if obj is None or t is bool or t is str:
        return ("=", obj)
    if t is tuple or t is list:
        if all(type(x) is Tensor for x in obj):  # the common call: tensors only
            leaves.extend(obj)
            return (t, (_LEAF,) * len(obj))
        return (t, tuple([_flatten(x, leaves, f"{path}[{i}]") for i, x in enumerate(obj)]))
    if t is dict:
        keys = tuple(obj)
        return (dict, keys, tuple([_flatten(obj[k], leaves, f"{path}[{k!r}]") for k in keys]))
    if isinstance(obj, tuple) and hasattr(t, "_fields"):  # a NamedTuple
        return (t, tuple([_flatten(x, leaves, f"{path}.{n}") for n, x in zip(t._fields, obj)]))
    if isinstance(obj, np.generic) and obj.ndim == 0 and obj.dtype.kind in "fiub":
        return _flatten(obj.item(), leaves, path)
    if isinstance(obj, bool):  # subclasses (IntEnum, ...) by value
        return ("=", bool(obj))
    if isinstance(obj, int):
        return _flatten(int(obj), leaves, path)
    if isinstance(obj, float):
        return _flatten(float(obj), leaves, path)
    hint = "; upload it with dev.tensor() first" if isinstance(obj, np.ndarray) else ""
    raise CaptureError(
        f"{path} is a {type(obj).__name__}: a compiled function takes tensors, Python "
        f"numbers (bound per call), bools, strings and None (fixed per capture), and lists, "
        f"tuples and dicts of them{hint}"
    )


def _describe_leaf(leaf: Any, dev: Any, first: dict[int, int], pos: int) -> Any:
    if type(leaf) is Tensor:
        if leaf._dev is not dev:
            raise CaptureError(
                f"argument leaf {pos} is on {leaf._dev}, another argument on {dev}: a compiled "
                "function runs on one device"
            )
        return (leaf.shape, leaf.dtype, first.setdefault(leaf._id, pos))
    return type(leaf)


_CAPTURE_LOCK = Lock()
"""Makes checking that a device is free to capture and claiming it one step."""


# --- the log a recording keeps ------------------------------------------------------------------
class _Log:
    """What the body did besides recording ops: binding sources, host effects, uploads."""

    __slots__ = ("compiled", "actions", "uploads", "rec", "thread")

    def __init__(self, compiled: Compiled, rec: Any) -> None:
        self.compiled = compiled
        self.rec = rec
        self.thread = get_ident()
        self.actions: list[tuple[int, Callable[[], Any]]] = []
        self.uploads: dict[int, bytes] = {}

    def uploaded(self, tensor_id: int, array: Any) -> None:
        data = np.asarray(array, order="C")  # keeps a 0-d array 0-d in the key
        self.uploads[tensor_id] = (
            hashlib.sha256(data.tobytes()).digest() + str((data.shape, data.dtype)).encode()
        )

    def sync_error(self) -> CaptureError:
        what = _sync_kind()
        return CaptureError(
            f"{what} at {fmt_location(user_location())} inside compiled function "
            f"{self.compiled.name}: a captured step cannot depend on tensor values (the "
            "body does not run on replays). Return the tensor and read it outside."
        )

    def other_thread(self) -> CaptureError:
        return CaptureError(
            f"an op at {fmt_location(user_location())} on a device that another thread is "
            f"capturing a step on (compiled function {self.compiled.name}): it would become "
            "part of that step; wait for the capture to end or use a device of its own"
        )

    def foreign_device(self, rec: Any) -> CaptureError:
        return CaptureError(
            f"an op on another device at {fmt_location(user_location())} inside compiled "
            f"function {self.compiled.name}: a compiled function captures one device's "
            "graph; move tensors with .to() outside it"
        )


def _sync_kind() -> str:
    """Name the read that happened, from the package frames on the stack (errors only)."""
    names: set[str] = set()
    f: FrameType | None = sys._getframe(2)
    while f is not None:
        names.add(f.f_code.co_name)
        f = f.f_back
    if "__bool__" in names:
        return "a Python branch on a tensor value (if/while/and/or/not on a tensor)"
    if names & {"__str__", "__format__", "__repr__"}:
        return "printing a tensor's value"
    if names & {"item", "__float__", "__int__", "__index__"}:
        return "item() on a tensor"
    if names & {"numpy", "tolist", "__array__"}:
        return "numpy() on a tensor"
    if names & {"memory_stats", "session_stats"}:
        return "memory_stats()"
    if names & {"sync", "flush"}:
        return "dev.sync()/flush()"
    return "reading a tensor's value"


# --- one recording, analysed ---------------------------------------------------------------------
class Compiled:
    """A step function with captures; see `compile`."""

    def __init__(
        self, fn: Callable[..., Any], device: Any = None, max_captures: int = MAX_CAPTURES
    ) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.device = device
        self.max_captures = max_captures
        code = getattr(fn, "__code__", None)
        where = f" ({code.co_filename}:{code.co_firstlineno})" if code is not None else ""
        self.name = f"{getattr(fn, '__qualname__', repr(fn))}{where}"
        self._entries: OrderedDict[Any, _Entry] = OrderedDict()
        self._last: tuple[Any, Any] = (None, None)
        self._fast: tuple | None = None
        """The last call's key, when it was tensors only, as ``_fast_guard`` lays it out."""
        self.recordings = 0
        """Calls that ran the body (recorded); the rest replayed."""
        self.replays = 0
        self.retraces: list[str] = []
        """Why each capture after the first was made (also logged at debug level)."""

    def __repr__(self) -> str:
        return f"compile({self.name})"

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        """A compiled method: the instance is passed through as is (captures are kept per
        instance, by identity), the other arguments are bound as for a function."""
        if obj is None:
            return self
        return functools.partial(self._invoke, obj)

    def stats(self) -> dict[str, int]:
        """``recordings`` (calls that ran the Python function to record a step), ``replays`` (calls
        that sent a captured step instead) and ``captures`` (shapes captured now, at most
        max_captures): a replay count that stays at 0 means the step is recorded every call."""
        return {
            "recordings": self.recordings,
            "replays": self.replays,
            "captures": sum(1 for e in self._entries.values() if e.replay is not None),
        }

    def reset(self) -> None:
        """Forget every capture: the next calls record again (after changing Python state
        that the graph depends on, such as an optimizer's hyper-parameters)."""
        for e in self._entries.values():
            e.clear()
        self._entries.clear()
        self._last = (None, None)
        self._fast = None

    # --- calls --------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._invoke(_UNBOUND, *args, **kwargs)

    def _invoke(self, bound: Any, *args: Any, **kwargs: Any) -> Any:
        fast = self._fast
        if fast is not None and not kwargs and fast[0] is bound and len(args) == len(fast[2]):
            # The common call: the same tensors-only signature as the last call, checked
            # leaf by leaf against it (the key the general path below would build and find
            # equal to the last one): shape, dtype, device, no two arguments the same tensor.
            dev = fast[1]
            for a, sd in zip(args, fast[2]):
                if type(a) is not Tensor or a._dev is not dev or (a.shape, a.dtype) != sd:
                    break
            else:
                if len({a._id for a in args}) == len(args) and _autograd.enabled() == fast[3]:
                    return self._run(fast[4], dev, list(args), fast[5], False, bound)
        flat: list[Any] = []
        try:
            spec = _flatten((args, kwargs) if kwargs else args, flat, "argument")
        except CaptureError as exc:
            raise CaptureError(
                f"{self.name} called at {fmt_location(user_location())}: {exc}"
            ) from None
        dev = self.device
        for leaf in flat:
            if type(leaf) is Tensor:
                dev = leaf._dev if dev is None else dev
                break
        if dev is None:
            raise CaptureError(
                f"compiled function {self.name} got no tensor argument: pass one, or give the "
                "device with compile(fn, device=dev)"
            )
        first: dict[int, int] = {}
        key = (
            spec,
            tuple([_describe_leaf(x, dev, first, p) for p, x in enumerate(flat)]),
            _autograd.enabled(),
            id(dev),
            id(bound),
        )
        if key == self._last[0]:  # the common case: the same signature as the last call
            entry = self._last[1]
        else:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._new_entry(key)
            else:
                self._entries.move_to_end(key)
            self._last = (key, entry)
            self._fast = _fast_guard(bound, dev, spec, key, entry)
        return self._run(entry, dev, flat, spec, bool(kwargs), bound)

    def _run(self, entry: _Entry, dev: Any, flat: list, spec: Any, has_kw: bool, bound: Any) -> Any:
        """Replay ``entry`` when its capture still holds, else record the call again."""
        if entry.replay is not None:
            if entry.epoch == epoch():
                try:
                    out = entry.replay.run(flat)
                except _Miss as miss:
                    self._retrace(str(miss))
                    entry.clear()
                else:
                    self.replays += 1
                    return out
            else:
                self._retrace(
                    "a module's train/eval mode or a tensor's requires_grad changed since the "
                    "capture"
                )
                entry.clear()
        return self._record(entry, dev, flat, spec, has_kw, bound)

    def _new_entry(self, key: Any) -> _Entry:
        if self._entries:
            self._retrace(_explain(next(reversed(self._entries)), key))
        entry = self._entries[key] = _Entry()
        while len(self._entries) > self.max_captures:
            _, old = self._entries.popitem(last=False)
            old.clear()
            log.debug("%s: evicted its least recently used capture", self.name)
        return entry

    def _retrace(self, why: str) -> None:
        if len(self.retraces) < 100:
            self.retraces.append(why)
        log.debug("capturing %s again: %s", self.name, why)

    def _record(
        self, entry: _Entry, dev: Any, flat: list, spec: Any, has_kw: bool, bound: Any
    ) -> Any:
        rec = dev._rec
        rec.flush()  # what ran before the call is not part of the step
        self.recordings += 1
        replay, result = _record(self, rec, dev, flat, spec, has_kw, bound)
        _step_done(dev)
        entry.epoch = epoch()
        if replay is None:
            return result
        last = entry.recordings[-1] if entry.recordings else None
        if last is not None and last.signature == replay.signature:
            entry.clear()
            entry.replay, entry.attempts = replay, 0
            return result
        entry.clear()
        entry.recordings = [replay]
        if last is None:
            # the first recording since the capture was dropped (a new signature, a mode or
            # requires_grad change, a guard miss): nothing to disagree with yet. Counting it
            # made a loop that evaluates between epochs (eval(), then train()) fail after 4.
            return result
        entry.attempts += 1
        if entry.attempts >= MAX_RECORDINGS:
            entry.clear()
            raise CaptureError(
                f"compiled function {self.name} recorded a different step on each of "
                f"{MAX_RECORDINGS} calls with the same argument shapes ({_difference(last, replay)}): "
                "its graph depends on Python state that changes between calls; pass such "
                "values as arguments"
            )
        log.debug(
            "%s: recording differs from the previous one (%s)", self.name, _difference(last, replay)
        )
        return result


def _fast_guard(bound: Any, dev: Any, spec: Any, key: tuple, entry: _Entry) -> tuple | None:
    """(bound, device, ((shape, dtype) per argument), grad mode, entry, spec) for a key made
    of positional tensor arguments only, all different tensors (what ``_invoke`` checks
    first); None for any other signature."""
    leaves = key[1]
    if type(spec) is not tuple or spec[0] is not tuple or spec[1] != (_LEAF,) * len(leaves):
        return None
    for pos, leaf in enumerate(leaves):
        if type(leaf) is not tuple or leaf[2] != pos:  # a number, or a repeated tensor
            return None
    return (bound, dev, tuple([leaf[:2] for leaf in leaves]), key[2], entry, spec)


class _Entry:
    __slots__ = ("recordings", "replay", "epoch", "attempts")

    def __init__(self) -> None:
        self.recordings: list[_Replay] = []
        self.replay: _Replay | None = None
        self.epoch = -1
        self.attempts = 0

    def clear(self) -> None:
        for r in self.recordings:
            r.release()
        if self.replay is not None:
            self.replay.release()
        self.recordings, self.replay = [], None


def _step_done(dev: Any) -> None:
    step_done = getattr(dev._rec.runtime, "step_done", None)
    if step_done is not None:
        step_done()


def _explain(old: Any, new: Any) -> str:
    """Why a call missed every capture: the first difference from the most recent one."""
    if old[0] != new[0]:
        return "the arguments' structure (or a bool, string or None among them) changed"
    for pos, (a, b) in enumerate(zip(old[1], new[1])):
        if a != b:
            if isinstance(a, tuple) and isinstance(b, tuple):
                if a[0] != b[0]:
                    return f"argument leaf {pos}: shape {b[0]}, captured with {a[0]}"
                if a[1] != b[1]:
                    return f"argument leaf {pos}: dtype {b[1]}, captured with {a[1]}"
                return (
                    f"argument leaf {pos} is now the same tensor as another argument (or no longer)"
                )
            return f"argument leaf {pos}: {getattr(b, '__name__', b)}, captured with {getattr(a, '__name__', a)}"
    if old[2] != new[2]:
        return "called with gradients " + ("enabled" if new[2] else "disabled (no_grad)")
    return "another device"


def _difference(a: _Replay | None, b: _Replay) -> str:
    if a is None:
        return "first recording"
    sa, sb = a.signature, b.signature
    if sa[0] != sb[0]:
        na, nb = a.template.nodes, b.template.nodes
        for k, (x, y) in enumerate(zip(sa[0][1], sb[0][1])):
            if x != y:
                return f"op {nb[k].op} recorded at {fmt_location(nb[k].where)} differs"
        if sa[0][0] != sb[0][0]:
            return "the state the step reads differs"
        return f"{len(na)} ops then, {len(nb)} now"
    labels = (
        "graph",
        "inputs",
        "outputs",
        "a constant value",
        "uploaded data",
        "bindings",
        "scalar arguments",
        "result",
    )
    for label, x, y in zip(labels, sa, sb):
        if x != y:
            if label == "a constant value":
                return "a value recorded with dev.scalar() inside the function changed: make it an argument"
            if label == "uploaded data":
                return "data uploaded inside the function changed: pass it as an argument"
            return f"its {label} differ"
    return "no difference found"


def _record(
    compiled: Compiled, rec: Any, dev: Any, flat: list, spec: Any, has_kw: bool, bound: Any
) -> tuple[_Replay | None, Any]:
    """Run the body once while recording; return its analysed capture and its result."""
    if capture_here() is not None:
        raise CaptureError(
            f"compiled function {compiled.name} called inside another compiled function: "
            "compile the outer one only"
        )
    live0 = _live_tensors(dev)
    start: dict[int, list[Any]] = {}
    grad_start: dict[int, Any] = {}
    for o in live0:
        start.setdefault(o._id, []).append(weakref.ref(o))
        g = o.grad
        if g is not None and g._dev is dev:
            grad_start.setdefault(g._id, weakref.ref(o))
    del live0
    arg_ids: dict[int, int] = {}
    call_leaves = list(flat)
    for pos, leaf in enumerate(flat):
        if type(leaf) is Tensor:
            arg_ids.setdefault(leaf._id, pos)
    scalar_ids: dict[int, int] = {}
    journal = _Log(compiled, rec)
    with _CAPTURE_LOCK:
        if rec in CAPTURING:
            raise CaptureError(
                f"compiled function {compiled.name}: another thread is capturing a step on "
                f"this device right now ({rec.log.compiled.name}); capture on one device "
                "from one thread at a time"
            )
        rec.log, rec._held = journal, True
        CAPTURING.append(rec)
    try:
        for pos, leaf in enumerate(flat):
            if type(leaf) is not Tensor:
                t = dev.scalar(leaf, "float32" if type(leaf) is float else "int64")
                scalar_ids[t._id] = pos
                call_leaves[pos] = t
        tree = _unflatten(spec, call_leaves, [0])
        del call_leaves
        args, kwargs = tree if has_kw else (tree, {})
        del tree
        if bound is not _UNBOUND:
            args = (bound, *args)
        result = compiled.fn(*args, **kwargs)
        del args, kwargs
    finally:
        rec.log, rec._held = None, False
        CAPTURING.remove(rec)
    res_leaves: list[Any] = []
    res_spec = _flatten_result(compiled, result, res_leaves)
    capture = rec.capture()
    if capture is None:
        return None, result
    consts = [i for i in capture.input_ids if i in journal.uploads]
    for i in consts:
        rec.retain(i)
    if consts:
        refs = rec.refs
        capture.donated = [k for k, i in enumerate(capture.input_ids) if i not in refs]
    rec.submit(capture)
    replay = _Replay()
    replay.rec, replay.dev = rec, dev
    replay.consts = consts
    replay.template = capture
    seen = _Seen(flat, journal, start, grad_start, arg_ids, scalar_ids, res_leaves, res_spec)
    try:
        _analyse(compiled, replay, dev, capture, seen)
    except BaseException:
        replay.release()
        raise
    capture.provenance()
    return replay, result


def _flatten_result(compiled: Compiled, result: Any, leaves: list) -> Any:
    try:
        spec = _flatten(result, leaves, "the result")
    except CaptureError as exc:
        raise CaptureError(f"compiled function {compiled.name}: {exc}") from None
    for leaf in leaves:
        if type(leaf) is not Tensor:
            raise CaptureError(
                f"compiled function {compiled.name} returns a Python {type(leaf).__name__}: it "
                "would be the captured value on every replay; return tensors (or None)"
            )
        if leaf._node is not None and leaf._node.inputs is not None:  # a tape not yet freed
            raise CaptureError(
                f"compiled function {compiled.name} returns a tensor still on the autograd tape "
                "(its backward would have to run outside the step): call backward() inside, or "
                "return .detach()"
            )
    return spec


def compile(
    fn: Callable[..., Any] | None = None,
    *,
    device: Any = None,
    max_captures: int = MAX_CAPTURES,
) -> Any:
    """Capture a step function once and replay it on later calls (`@br.compile` or
    `br.compile(fn)`).

    The first calls run `fn` and record its graph; once two recordings agree, a call checks
    its guard (argument structure, shapes, dtypes and device; bools/strings/None by value; the
    shapes of the state the capture read; train/eval mode and requires_grad flags) and
    replays without running the body. A guard miss captures again (up to `max_captures`
    signatures are kept); `logging.getLogger("burn_remote.compile")` says why at DEBUG level,
    and `.retraces` keeps the reasons.

    Args:
        fn: the step. It takes tensors, Python numbers (bound per call: they arrive as 0-d
            float32/int64 tensors), bools, strings and None (fixed per capture), and lists,
            tuples and dicts of them. It returns tensors (detached on replays), or None.
        device: the device when no argument is a tensor.
        max_captures: signatures kept per function.

    Raises:
        CaptureError: the body read a tensor value (item, numpy, printing, a Python branch on
            a tensor), recorded on another device, took or returned something that cannot be
            bound, or recorded a different graph on every call.
    """
    if fn is None:
        return lambda f: Compiled(f, device, max_captures)
    return Compiled(fn, device, max_captures)


__all__ = ["CaptureError", "Compiled", "binding", "capturing", "compile", "on_replay"]
