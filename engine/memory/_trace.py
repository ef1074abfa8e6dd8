"""Trace replay: feed one recorded allocation trace to the static baseline and to the adaptive
pools with arena planning, and report what each reserved.

The bench records a real training step through the engine and hands it here, so both sides
see exactly the same requests in the same order; virtual pages keep replays cheap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ._arena import Buffer, plan_arena
from ._block import Block
from ._device import Arena, DeviceMemory
from ._pages import VirtualPageAllocator


@dataclass(frozen=True)
class Alloc:
    """An allocation of `nbytes` under a trace-unique `id`."""

    id: int
    nbytes: int
    transient: bool = False
    """A graph intermediate: allocated and freed inside one step, so the arena may plan it."""


@dataclass(frozen=True)
class Free:
    """The end of allocation `id`."""

    id: int


Event = Alloc | Free
Step = list[Event]


@dataclass(frozen=True)
class ReplayResult:
    """What one policy did with a trace."""

    policy: str
    peak_live: int
    """Most requested bytes live at once: the floor no allocator can go under."""
    peak_reserved: int
    """Most bytes held from the device at once, over every step."""
    steady_peak_reserved: int
    """The same, over the steps after the first (after the dry run)."""
    steady_page_allocs: int
    """Page reservations during the steps after the first (driver calls on a GPU)."""
    arena_bytes: int = 0
    arena_lower_bound: int = 0
    rows: tuple[Any, ...] = field(default=(), repr=False)

    @property
    def ratio(self) -> float:
        """Peak reserved over peak live."""
        return self.peak_reserved / self.peak_live if self.peak_live else 1.0


def peak_live(steps: list[Step]) -> int:
    """Most requested bytes live at once across the trace."""
    sizes: dict[int, int] = {}
    live = peak = 0
    for step in steps:
        for event in step:
            if isinstance(event, Alloc):
                sizes[event.id] = event.nbytes
                live += event.nbytes
                peak = max(peak, live)
            else:
                live -= sizes.pop(event.id)
    return peak


def transient_buffers(step: Step) -> tuple[list[int], list[Buffer]]:
    """The step's transient allocations freed within it, in allocation order, as arena
    buffers whose steps are event positions."""
    born: dict[int, tuple[int, int]] = {}
    spans: dict[int, Buffer] = {}
    order: list[int] = []
    for pos, event in enumerate(step):
        if isinstance(event, Alloc) and event.transient:
            born[event.id] = (pos, event.nbytes)
            order.append(event.id)
        elif isinstance(event, Free) and event.id in born:
            start, nbytes = born.pop(event.id)
            spans[event.id] = Buffer(nbytes, start, pos)
    ids = [i for i in order if i in spans]
    return ids, [spans[i] for i in ids]


def replay(
    steps: list[Step],
    policy: Literal["static", "adaptive"],
    setup: Sequence[Event] = (),
    movable: bool = True,
    static_classes: tuple[tuple[int, int], ...] | None = None,
) -> ReplayResult:
    """Replay `setup` (e.g. creating parameters) then `steps` under ``static`` (with
    `static_classes`, e.g. ``subslice_classes(...)``, or the default classes) or
    ``adaptive`` (adaptive pools + arena planning).

    Adaptive: step 0 is the dry run (everything through the pool, statistics recorded); its
    transient buffers are then planned into one arena, and later steps put their transient
    allocations (matched by order and size) at the planned offsets.
    """
    if policy not in ("static", "adaptive"):
        raise ValueError(f"unknown policy {policy!r}: use 'static' or 'adaptive'")
    mem = DeviceMemory(
        "trace",
        VirtualPageAllocator(),
        pool=policy,
        static_classes=static_classes,
    )
    live: dict[int, Block] = {}
    arena: Arena | None = None
    steady_peak = 0
    steady_allocs = 0
    for event in setup:
        if isinstance(event, Alloc):
            live[event.id] = mem.alloc(event.nbytes, movable=movable)
        else:
            mem.free(live.pop(event.id))
    for number, step in enumerate(steps):
        dry = policy == "adaptive" and number == 0
        if dry:
            mem.begin_dry_run()
        allocs_before = _page_allocs(mem)
        slots = _arena_slots(step, arena) if arena is not None else {}
        for event in step:
            if isinstance(event, Alloc):
                if arena is not None and event.id in slots:
                    live[event.id] = arena.alloc(slots[event.id], event.nbytes)
                else:
                    live[event.id] = mem.alloc(event.nbytes, movable=movable)
            else:
                mem.free(live.pop(event.id))
            if number >= 1:
                steady_peak = max(steady_peak, mem.source.reserved)
        if number >= 1:
            steady_allocs += _page_allocs(mem) - allocs_before
        if dry:
            mem.end_dry_run()
            _, buffers = transient_buffers(step)
            if buffers:
                arena = mem.arena("step", plan_arena(buffers))
    plan = arena.plan if arena is not None else None
    return ReplayResult(
        policy,
        peak_live([list(setup), *steps]),
        mem.source.peak_reserved,
        steady_peak,
        steady_allocs,
        plan.size if plan else 0,
        plan.lower_bound if plan else 0,
        mem.memory_stats().pools,
    )


def _arena_slots(step: Step, arena: Arena) -> dict[int, int]:
    """Map this step's transient allocation ids to planned buffers, in order, when they fit."""
    ids, buffers = transient_buffers(step)
    planned = arena.plan.buffers
    if len(ids) != len(planned):
        return {}
    return {i: k for k, (i, b) in enumerate(zip(ids, buffers)) if b.size <= planned[k].size}


def _page_allocs(mem: DeviceMemory) -> int:
    return sum(p.page_allocs for p in mem.memory_stats().pools)
