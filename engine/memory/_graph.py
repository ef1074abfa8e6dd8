"""Executor-side memory: every tensor a compiled graph makes lives in a pool or arena block.

The executor calls `GraphMemory.run(plan)` once per execution and, per step, `release` for
the slots whose last reader was that step and then `place` for its results. Releasing before
placing is what makes in-place reuse safe for every op: the kernel has already produced its
result, so a dying input's bytes may take that result (NumPy's copy handles the overlap).

The first execution of a plan is the dry run: everything goes through the pool, which records
statistics and sizes its pages from them; the intermediates' lifetimes seen there are planned
into one arena, and later executions put each intermediate at its planned offset.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._arena import Buffer, plan_arena
from ._block import Block
from ._device import Arena, DeviceMemory
from ._errors import MemoryQuotaExceeded
from ._trace import Alloc, Event, Free

PLAN_STATES_KEPT = 256
"""Plans whose arena and statistics are remembered (matches the executor's plan cache)."""


class _PlanState:
    __slots__ = ("plan", "runs", "arena", "index")

    def __init__(self, plan: Any) -> None:
        self.plan = plan
        self.runs = 0
        self.arena: Arena | None = None
        self.index: dict[int, int] = {}


class GraphMemory:
    """Owns the blocks behind a device's tensors and the arenas of its cached graphs.

    Args:
        memory: the device's memory (pool, arenas, quota).
        trace: record every allocation and free (for `bench/memory.py`).
    """

    def __init__(self, memory: DeviceMemory, trace: bool = False) -> None:
        self.memory = memory
        self._owned: dict[int, list[Any]] = {}  # id(array) -> [block, refs, array]
        self._states: dict[int, _PlanState] = {}
        self.trace: list[Event] | None = [] if trace else None
        self._next_id = 0
        self._trace_ids: dict[int, int] = {}

    # --- tensors outside graphs ------------------------------------------------------------

    def adopt(self, array: Any) -> Any:
        """Copy `array` into a pool block and own it (uploads, scalar outputs)."""
        block = self._alloc(array.nbytes, transient=False)
        view = _fill(block, array)
        self._owned[id(view)] = [block, 1, view]
        return view

    def retain(self, array: Any) -> Any:
        """One more holder of an owned array (a graph returning its own input); else adopt."""
        entry = self._owned.get(id(array))
        if entry is None or entry[2] is not array:
            return self.adopt(np.asarray(array))
        entry[1] += 1
        return array

    def forget(self, array: Any) -> None:
        """A holder let go of `array`; its block is freed with the last holder."""
        entry = self._owned.get(id(array))
        if entry is None or entry[2] is not array:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del self._owned[id(array)]
            self._free(entry[0])

    # --- graph executions ------------------------------------------------------------------

    def run(self, plan: Any) -> GraphRun:
        """Memory for one execution of `plan` (anything with `outputs` and `n_inputs`)."""
        state = self._states.pop(id(plan), None)
        if state is None or state.plan is not plan:
            state = _PlanState(plan)
        self._states[id(plan)] = state
        while len(self._states) > PLAN_STATES_KEPT:
            old = self._states.pop(next(iter(self._states)))
            if old.arena is not None:
                self.memory.drop_arena(old.arena.name)
        return GraphRun(self, state)

    def _alloc(self, nbytes: int, transient: bool) -> Block:
        block = self.memory.alloc(nbytes)
        self._note_alloc(block, transient)
        return block

    def start_trace(self) -> list[Event]:
        """Record allocations and frees from now on (earlier blocks are left out)."""
        self.trace = []
        self._trace_ids = {}
        return self.trace

    def _note_alloc(self, block: Block, transient: bool) -> None:
        if self.trace is not None:
            self._trace_ids[id(block)] = self._next_id
            self.trace.append(Alloc(self._next_id, block.nbytes, transient))
            self._next_id += 1

    def _free(self, block: Block) -> None:
        ident = self._trace_ids.pop(id(block), None)
        if self.trace is not None and ident is not None:  # blocks from before tracing: skip
            self.trace.append(Free(ident))
        self.memory.free(block)


class GraphRun:
    """The blocks of one execution: intermediates (arena or pool) and outputs (pool)."""

    def __init__(self, owner: GraphMemory, state: _PlanState) -> None:
        self.owner = owner
        self.state = state
        self.outputs = set(state.plan.outputs)
        self.blocks: dict[int, Block] = {}
        self.dry = state.runs == 0
        self.clock = 0
        self.born: dict[int, tuple[int, int]] = {}
        self.spans: dict[int, Buffer] = {}
        self.donated: dict[int, Any] = {}
        if self.dry:
            owner.memory.begin_dry_run()

    def place(self, slot: int, array: Any) -> Any:
        """Copy a step's result into the slot's block; returns the view that replaces it."""
        nbytes = array.nbytes
        block = None
        transient = slot not in self.outputs
        arena = self.state.arena
        if transient and arena is not None and slot in self.state.index:
            index = self.state.index[slot]
            if nbytes <= arena.plan.buffers[index].size:
                try:
                    block = arena.alloc(index, nbytes)
                    self.owner._note_alloc(block, True)
                except MemoryQuotaExceeded:
                    block = None
        if block is None:
            block = self.owner._alloc(nbytes, transient)
        self.blocks[slot] = block
        if self.dry and transient:
            self.born[slot] = (self.clock, nbytes)
        self.clock += 1
        return _fill(block, array)

    def donate(self, slot: int, array: Any) -> None:
        """An input its holder gave up: this execution frees it at its last use."""
        self.donated[slot] = array

    def release(self, slot: int) -> None:
        """The slot's last reader has run: free its block."""
        donated = self.donated.pop(slot, None)
        if donated is not None:
            self.owner.forget(donated)
            return
        block = self.blocks.pop(slot, None)
        if block is None:
            return
        if slot in self.born:
            start, nbytes = self.born.pop(slot)
            self.spans[slot] = Buffer(nbytes, start, self.clock)
        self.clock += 1
        self.owner._free(block)

    def finish(self, arrays: list[Any]) -> list[Any]:
        """Hand the outputs to their holders (owned, freed by `forget`); end the dry run."""
        out = []
        for slot, array in zip(self.state.plan.outputs, arrays):
            block = self.blocks.pop(slot, None)
            if block is None:
                out.append(self.owner.retain(array))
            else:
                self.owner._owned[id(array)] = [block, 1, array]
                out.append(array)
        for slot in list(self.blocks):  # produced but never read: dead values
            self.release(slot)
        self._end()
        return out

    def abort(self) -> None:
        """A kernel failed: free everything this execution allocated (and what was donated)."""
        for array in self.donated.values():
            self.owner.forget(array)
        self.donated.clear()
        for block in self.blocks.values():
            self.owner._free(block)
        self.blocks.clear()
        if self.dry:
            self.owner.memory.end_dry_run()
        self.dry = False

    def _end(self) -> None:
        state = self.state
        state.runs += 1
        if not self.dry:
            return
        self.owner.memory.end_dry_run()
        slots = sorted(self.spans)
        if slots:
            plan = plan_arena([self.spans[s] for s in slots])
            state.index = {s: k for k, s in enumerate(slots)}
            state.arena = self.owner.memory.arena(f"graph{id(state.plan):x}", plan)


def _fill(block: Block, array: Any) -> Any:
    view = block.view(array.shape, array.dtype)
    np.copyto(view, array) if isinstance(view, np.ndarray) else view.__setitem__(..., array)
    return view
