"""Recording: the pending op list of one device, tensor lifetimes, and graph capture at a sync.

Shared by every device kind. A runtime (in-process engine, or a remote session) only has to
store uploaded arrays, execute a captured graph under bindings, read arrays back and drop ids.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from threading import get_ident
from types import FrameType
from typing import Any, Protocol

import numpy as np
from burn_remote.protocol import ops as _declared  # noqa: F401  (the registry, filled)
from burn_remote.protocol.graph import Graph, GraphNode
from burn_remote.protocol.registry import by_category

ALWAYS_RUN = by_category("collective")
"""Ops kept even when nothing holds their result (dead-code elimination skips them)."""

MAX_PENDING_OPS = 10_000
"""Past this many recorded ops the device flushes on its own, bounding client memory."""

CAPTURING: list[Recorder] = []
"""Recorders capturing a compiled function's step right now (see `_compile`), at most one per
thread and one per device: threads capture at once on devices of their own. An op the
capturing thread records on any other device meanwhile would run once, not on every replay,
and an op another thread records on the capturing device would join the step: both are
refused (other threads record on other devices as usual)."""


def capture_here() -> Recorder | None:
    """The recorder this thread is capturing a compiled step on, if any."""
    me = get_ident()
    for rec in CAPTURING:
        if rec.log.thread == me:
            return rec
    return None


_epoch = [0]


def structure_changed() -> None:
    """Python state that shapes recorded graphs changed (train/eval mode, a tensor's
    requires_grad): compiled functions capture again instead of replaying a stale graph."""
    _epoch[0] += 1


def epoch() -> int:
    return _epoch[0]


_PKG_ROOTS = tuple(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep + d + os.sep
    for d in ("client", "protocol", "engine", "server")
) + (os.path.dirname(os.path.abspath(__file__)) + os.sep,)


def user_location() -> tuple[str, int]:
    """The first stack frame outside this package: the user's line that recorded an op."""
    f: FrameType | None = sys._getframe(2)
    while f is not None and f.f_code.co_filename.startswith(_PKG_ROOTS):
        f = f.f_back
    if f is None:
        return ("<unknown>", 0)
    return (f.f_code.co_filename, f.f_lineno)


def fmt_location(where: tuple[str, int] | None) -> str:
    return f"{where[0]}:{where[1]}" if where else "<unknown>"


def not_a_tensor(name: str, value: Any) -> TypeError:
    """The error for a non-tensor operand, naming the user's line and, for host data (a
    NumPy array, a list: the usual mistake, a batch passed straight to a layer), the fix."""
    kind = "NumPy array" if isinstance(value, np.ndarray) else type(value).__name__
    if isinstance(value, np.ndarray) or type(value).__module__.startswith(("numpy", "torch")):
        hint = f"; a {kind} is host data: upload it first with dev.tensor(x)"
    elif isinstance(value, list | tuple):
        hint = f"; a {kind} is host data: make it a tensor first with dev.tensor(x)"
    else:
        hint = ""
    where = fmt_location(user_location())
    return TypeError(f"{name}: expected tensor operands, got {kind}{hint} (at {where})")


class Node:
    """One recorded op: concrete tensor ids, bound attributes and where the user recorded it."""

    __slots__ = ("op", "inputs", "attrs", "outputs", "specs", "where", "value")

    def __init__(self, op, inputs, attrs, outputs, specs, where, value=None):
        self.op: str = op
        self.inputs: tuple[int, ...] = inputs
        self.attrs: tuple = attrs
        self.outputs: tuple[int, ...] = outputs
        self.specs: tuple = specs
        self.where: tuple[str, int] = where
        self.value: Any = value


class Runtime(Protocol):
    """Where a device's tensors live; the recorder never looks inside."""

    def upload(self, tensor_id: int, array: Any) -> None:
        """Store a NumPy ``array`` under ``tensor_id`` (ids are the recorder's, never reused
        while live); may return before the copy is done, but a later read sees it."""
        ...

    def execute(self, capture: Capture) -> None:
        """Run a captured graph, storing its outputs under ``capture.output_ids``. May be
        asynchronous: a failure then surfaces, as OpFailed naming the op, at a later read."""
        ...

    def read(self, tensor_id: int) -> Any:
        """The tensor's value as a NumPy array, once everything it depends on has run.
        Raises OpFailed when the graph that produced it failed."""
        ...

    def drop(self, ids: Sequence[int]) -> None:
        """Free the tensors ``ids`` (no Tensor refers to them any more); unknown ids are
        ignored, so a drop can race a failed graph."""
        ...

    def stats(self) -> Any:
        """Counters of this runtime for `Device.stats()`: graphs registered, replays and
        tensors held; a remote one adds messages and bytes each way, errors, resumes."""
        ...

    def memory_stats(self) -> Any:
        """Reserved and in-use bytes and their peaks (a MemoryStats, a dict for a remote
        device), as `Device.memory_stats()` returns them."""
        ...


class OpFailed(RuntimeError):
    """An op failed when its graph ran; names the op and the user's line that recorded it."""


class Capture:
    """A graph ready to run: its structure key/hash plus the concrete bindings."""

    __slots__ = (
        "donated",
        "inplace",
        "step",
        "prov",
        "key",
        "digest",
        "nodes",
        "input_ids",
        "values",
        "output_ids",
        "output_specs",
        "_graph",
    )

    def __init__(self, key, digest, nodes, input_ids, values, output_ids, output_specs, graph=None):
        self.key = key
        self.digest: str = digest
        self.nodes: list[Node] = nodes
        self.input_ids: list[int] = input_ids
        self.values: list[Any] = values
        self.output_ids: list[int] = output_ids
        self.output_specs: list[tuple] = output_specs
        self._graph: Graph | None = graph
        self.donated: list[int] = []
        """Positions of inputs no Tensor holds any more (an optimizer's old parameters): the
        runtime may free them inside the graph. Not part of the hash."""
        self.inplace: list[int] = []
        """Positions of inputs whose id is also one of `output_ids` (a compiled step's state,
        written in place under the id it keeps): the runtime hands their memory to the graph
        and stores the new value under the same id. If the graph fails they are gone (their
        ids then fail to read), never half-updated."""
        self.step = False
        """A compiled function's replay (one step): a runtime that paces steps (remote:
        ``RemoteRuntime.step_done``) counts it as it queues it."""
        self.prov: tuple | None = None
        """(ops, wheres) per node, built once: a compiled function's replays share it."""

    @property
    def graph(self) -> Graph:
        """The wire form of this capture (`protocol.graph.Graph`: input specs, nodes with relative
        ids, outputs), built on first use and then kept: what a remote runtime registers, and what
        `digest` hashes into the cache key."""
        if self._graph is None:
            in_specs, node_keys, outputs = self.key
            self._graph = Graph(
                inputs=in_specs,
                nodes=tuple(
                    GraphNode(op, ins, attrs, specs) for op, ins, attrs, specs in node_keys
                ),
                outputs=outputs,
            )
        return self._graph

    def where(self, node_index: int) -> tuple[str, int] | None:
        """(file, line) of the user code that recorded node ``node_index``, or None for an index
        outside the graph: how a failure reported by index is turned back into a source line."""
        return self.nodes[node_index].where if 0 <= node_index < len(self.nodes) else None

    def provenance(self) -> tuple[tuple[str, ...], tuple[tuple[str, int], ...]]:
        """Each node's op and recording line, for errors that come back later (remote)."""
        if self.prov is None:
            nodes = self.nodes
            self.prov = (tuple([n.op for n in nodes]), tuple([n.where for n in nodes]))
        return self.prov


_DIGESTS: dict[tuple, tuple[str, Graph]] = {}
"""Structure key -> (hash, graph), so a replayed step hashes nothing."""
MAX_DIGEST_CACHE = 4096


class Recorder:
    """Pending ops and tensor bookkeeping for one device."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.pending: list[Node] = []
        self.refs: dict[int, int] = {}
        self.specs: dict[int, tuple] = {}
        """Materialised ids (those that exist on the runtime) -> (shape, dtype)."""
        self.failed: dict[int, str] = {}
        self.dead: list[int] = []
        self._ids = itertools.count(1)
        self._held = False
        self.log: Any = None
        """The `_compile` capture log while a compiled function records its step, else None."""
        self.partners: dict[int, list[Any]] = {}
        """Group id -> the other ranks' devices (``collective.Group``): flushed before this
        device waits, since our graphs may wait at a collective for theirs."""

    def _refuse_if_foreign(self) -> None:
        """While a thread records a compiled step, work it puts on any other device would run
        once instead of on every replay, and work another thread puts on the capturing
        device would become part of the step: refuse both."""
        log = self.log
        if log is not None:
            if log.thread != get_ident():
                raise log.other_thread()
            return
        here = capture_here()
        if here is not None:
            raise here.log.foreign_device(self)

    def new_id(self) -> int:
        """A fresh tensor id for this device (1, 2, ...: never reused in a process, so a late drop
        cannot free a newer tensor)."""
        return next(self._ids)

    def retain(self, tensor_id: int) -> None:
        """Count one more Tensor holding ``tensor_id``: held ids are kept as graph outputs, others
        may be eliminated as dead code."""
        self.refs[tensor_id] = self.refs.get(tensor_id, 0) + 1

    def release(self, tensor_id: int) -> None:
        """Count one Tensor fewer for ``tensor_id``; at zero the id is queued to be dropped on the
        runtime at the next flush (or forgotten, if it was never computed)."""
        n = self.refs.get(tensor_id, 0) - 1
        if n > 0:
            self.refs[tensor_id] = n
            return
        self.refs.pop(tensor_id, None)
        if tensor_id in self.specs:
            self.dead.append(tensor_id)
        self.failed.pop(tensor_id, None)

    def add(self, node: Node) -> None:
        # Flush before appending: every pending output already has its Tensor, so the ones
        # still referenced are kept as outputs.
        """Record one op. Flushes first when MAX_PENDING_OPS are pending (outside `held`), so a long
        loop without a sync still runs in bounded graphs. Inside a compiled step's capture, an op on
        another device is refused (it would run once, not on every replay)."""
        if len(self.pending) >= MAX_PENDING_OPS and not self._held:
            self.flush()
        if CAPTURING:
            self._refuse_if_foreign()
        self.pending.append(node)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Record without running: inside, ops stay pending until the caller `capture()`s them.

        What runs first (everything pending before) is flushed on entry, so a capture taken
        inside holds only the ops recorded inside. Tracing exporters (ONNX) need the graph of
        a forward pass, not its values; a sync inside raises, since a traced graph cannot
        depend on data it would have to read.
        """
        if self._held:
            raise RuntimeError("this device is already holding its pending ops")
        self.flush()
        self._held = True
        try:
            yield
        finally:
            self._held = False

    def upload(self, tensor_id: int, array: Any, spec: tuple) -> None:
        """Send ``array`` to the runtime as ``tensor_id`` with ``spec`` (shape, dtype), and note it
        in a compiled step's capture log, if one is recording."""
        if CAPTURING:
            self._refuse_if_foreign()
        self.runtime.upload(tensor_id, array)
        self.specs[tensor_id] = spec
        if self.log is not None:
            self.log.uploaded(tensor_id, array)

    def capture(self) -> Capture | None:
        """Turn the pending ops into a graph with relative ids and bindings."""
        nodes = self.pending
        if not nodes:
            return None
        self.pending = []
        nodes = self._live_nodes(nodes)
        if not nodes:
            return None
        rel: dict[int, int] = {}
        input_ids: list[int] = []
        produced: set[int] = set()
        for n in nodes:
            for i in n.inputs:
                if i not in produced and i not in rel:
                    rel[i] = len(input_ids)
                    input_ids.append(i)
            produced.update(n.outputs)
        counter = len(input_ids)
        node_keys = []
        values = []
        output_ids: list[int] = []
        output_rel: list[int] = []
        output_specs: list[tuple] = []
        refs = self.refs
        for n in nodes:
            ins = tuple([rel[i] for i in n.inputs])
            for k, o in enumerate(n.outputs):
                rel[o] = counter
                if o in refs:
                    output_ids.append(o)
                    output_rel.append(counter)
                    output_specs.append(n.specs[k])
                counter += 1
            node_keys.append((n.op, ins, n.attrs, n.specs))
            if n.op == "value":
                values.append(n.value)
        self._check_inputs(input_ids, nodes)
        in_specs = tuple([self.specs[i] for i in input_ids])
        key = (in_specs, tuple(node_keys), tuple(output_rel))
        cached = _DIGESTS.get(key)
        if cached is None:
            graph = Capture(key, "", nodes, input_ids, values, output_ids, output_specs).graph
            if len(_DIGESTS) >= MAX_DIGEST_CACHE:
                _DIGESTS.clear()
            cached = _DIGESTS[key] = (graph.digest(), graph)
        capture = Capture(
            key, cached[0], nodes, input_ids, values, output_ids, output_specs, cached[1]
        )
        capture.donated = [k for k, i in enumerate(input_ids) if i not in refs]
        return capture

    def _live_nodes(self, nodes: list[Node]) -> list[Node]:
        """Dead-code elimination: keep nodes that feed a tensor somebody still holds.

        Gradients nobody asked for (of inputs that need none) and values dropped before the
        sync disappear here, so no engine computes them. Collectives always stay: the other
        ranks of their group wait for them whether or not this rank keeps the result.
        """
        refs = self.refs
        needed: set[int] = set()
        keep: list[Node] = []
        for n in reversed(nodes):
            if n.op in ALWAYS_RUN:
                keep.append(n)
                needed.update(n.inputs)
                continue
            for o in n.outputs:  # a plain loop: this runs once per node per sync
                if o in refs or o in needed:
                    keep.append(n)
                    needed.update(n.inputs)
                    break
        if len(keep) == len(nodes):
            return nodes
        keep.reverse()
        return keep

    def _check_inputs(self, input_ids: list[int], nodes: list[Node]) -> None:
        for i in input_ids:
            if i not in self.specs:
                reason = self.failed.get(i, f"tensor {i} does not exist on this device")
                raise OpFailed(f"an input of this graph is unavailable: {reason}")

    def flush(self) -> None:
        """Run everything pending; raise OpFailed naming the op and line if a kernel fails."""
        if self._held:
            if self.log is not None:
                if self.log.thread != get_ident():
                    raise self.log.other_thread()
                raise self.log.sync_error()
            if self.pending:
                raise OpFailed(
                    "a tensor value was read while recording without running (held); "
                    "graphs traced this way cannot depend on tensor data"
                )
        capture = self.capture()
        if capture is not None:
            self.submit(capture)
        else:
            self._drop_dead()

    def submit(self, capture: Capture) -> None:
        """Run a capture (recorded now, or a compiled function's replay) and keep its outputs."""
        try:
            self.runtime.execute(capture)
            self._forget_donated(capture)
        except OpFailed as exc:
            for o in capture.output_ids:
                self.failed[o] = str(exc)
            if capture.inplace:  # the runtime gave their memory to the failed graph
                ids = capture.input_ids
                for k in capture.inplace:
                    self.specs.pop(ids[k], None)
            raise
        finally:
            self._drop_dead()
        self.specs.update(zip(capture.output_ids, capture.output_specs))

    def _forget_donated(self, capture: Capture) -> None:
        """The runtime dropped the graph's donated inputs itself: no separate drop for them."""
        if capture.donated:
            ids = capture.input_ids
            gone = {ids[k] for k in capture.donated}
            pop = self.specs.pop
            for i in gone:
                pop(i, None)
            if self.dead:
                self.dead = [i for i in self.dead if i not in gone]

    def _drop_dead(self) -> None:
        if self.dead:
            dead, self.dead = self.dead, []
            dead = [i for i in dead if i not in self.refs]
            for i in dead:
                self.specs.pop(i, None)
            if dead:
                self.runtime.drop(dead)

    def flush_partners(self) -> None:
        """Send what the other ranks of our groups have recorded or queued, so that a read
        on one rank right after recording every rank's step cannot wait forever at a
        collective. Assumes one recording thread, the one that waits; with several, call
        ``collective.sync(devices)``."""
        for devices in list(self.partners.values()):
            for dev in devices:
                if not dev._rec._held:
                    dev.flush()

    def _sent_for_read(self, tensor_id: int) -> None:
        """Flush pending ops (and those of collective partners, which this one may wait on)
        before ``tensor_id`` is read; OpFailed with the op's error (and the line that
        recorded it) when the tensor was never computed."""
        self.flush()
        if self.partners:
            self.flush_partners()
        if tensor_id not in self.specs:
            raise OpFailed(self.failed.get(tensor_id, f"tensor {tensor_id} was never computed"))

    def read(self, tensor_id: int) -> Any:
        """The NumPy value of ``tensor_id``: flushes pending ops (and those of collective partners,
        which this one may wait on), then reads. Raises OpFailed with the op's error (and the line
        that recorded it) when the tensor was never computed."""
        self._sent_for_read(tensor_id)
        return self.runtime.read(tensor_id)

    def read_later(self, tensor_id: int) -> Callable[[], Any] | None:
        """Ask for ``tensor_id``'s value now, take it with the returned call: the value as
        it is now, whatever is recorded or replayed in between, which runs after the read
        (a decode loop reads a block's tokens while the next block is queued behind them).
        Only a runtime that queues work in order can (a remote one, ``request_read``);
        elsewhere None, and the caller reads when it wants the value."""
        request = getattr(self.runtime, "request_read", None)
        if request is None:
            return None
        self._sent_for_read(tensor_id)
        return request(tensor_id)  # type: ignore[no-any-return]

    def read_item(self, tensor_id: int) -> Any:
        """A one-element tensor's value as a Python number (a runtime may read it so)."""
        read_item = getattr(self.runtime, "read_item", None)
        if read_item is None:
            return self.read(tensor_id).reshape(()).item()
        self._sent_for_read(tensor_id)
        return read_item(tensor_id)


def op_failure(where: tuple[str, int] | None, op: str, message: str) -> OpFailed:
    """The user-facing error for a failed node: op name and the line that recorded it."""
    return OpFailed(f"{op} (recorded at {fmt_location(where)}) failed: {message}")
