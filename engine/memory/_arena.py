"""Arena planning for cached graphs: one offset per intermediate inside a single arena.

A compiled graph knows, for every buffer, the step that writes it first and the step that
reads it last. Two buffers whose step ranges meet must not share bytes; others may. Placing
them is interval packing (NP-hard in general), so the planner runs a greedy placement under
several orderings and keeps the smallest arena; `lower_bound` (the most bytes live at any one
step) says how far from optimal that is.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._block import align_up
from ._constants import ARENA_FITS, ARENA_ORDERINGS


@dataclass(frozen=True)
class Buffer:
    """One buffer of a graph: `size` bytes live from step `first` to step `last` inclusive."""

    size: int
    first: int
    last: int
    inplace_of: int | None = None
    """Index of a buffer this one may overwrite: the graph's op at step `first` reads that
    buffer for the last time and writes this one element by element (safe in place)."""


@dataclass(frozen=True)
class ArenaPlan:
    """Where each buffer lives in the arena, and how good that is."""

    buffers: tuple[Buffer, ...]
    offsets: tuple[int, ...]
    """Byte offset of each buffer (aligned to ALIGNMENT)."""
    size: int
    """Arena bytes needed."""
    lower_bound: int
    """Most aligned bytes live at any one step (in-place pairs counted once): no plan is smaller."""
    ordering: str
    """The ordering and fit that produced this plan, e.g. ``size/best``."""
    inplace: tuple[tuple[int, int], ...]
    """Accepted (buffer, overwritten buffer) pairs."""

    def verify(self) -> None:
        """Raise ValueError if two buffers live at the same step share bytes (other than an
        accepted in-place pair), if a buffer is misaligned, or if it leaves the arena."""
        allowed = set(self.inplace)
        sizes = [align_up(b.size) for b in self.buffers]
        for i, b in enumerate(self.buffers):
            if self.offsets[i] % align_up(1) or self.offsets[i] + sizes[i] > self.size:
                raise ValueError(f"buffer {i} at {self.offsets[i]} breaks alignment or arena")
            for j in range(i):
                c = self.buffers[j]
                if b.first > c.last or c.first > b.last:
                    continue
                if (i, j) in allowed or (j, i) in allowed:
                    continue
                lo, hi = self.offsets[i], self.offsets[i] + sizes[i]
                if lo < self.offsets[j] + sizes[j] and self.offsets[j] < hi:
                    raise ValueError(f"buffers {j} and {i} are live together and overlap")

    @property
    def overhead(self) -> float:
        """Arena size over the lower bound (1.0 is optimal)."""
        return self.size / self.lower_bound if self.lower_bound else 1.0


def plan_arena(buffers: list[Buffer] | tuple[Buffer, ...]) -> ArenaPlan:
    """Assign every buffer an offset so that buffers live at the same step never overlap.

    In-place hints are accepted when the overwritten buffer dies at the step this one is born
    and is at least as large, and no other buffer already overwrote it; accepted pairs share
    a slot. Every ordering in ARENA_ORDERINGS is tried with every fit in ARENA_FITS.
    """
    buffers = tuple(buffers)
    for i, b in enumerate(buffers):
        if b.size < 0 or b.first > b.last:
            raise ValueError(f"buffer {i} has a negative size or ends before it starts: {b}")
    groups, slot_of, inplace = _group_inplace(buffers)
    sizes = [align_up(buffers[g[0]].size) for g in groups]
    spans = [(buffers[g[0]].first, max(buffers[m].last for m in g)) for g in groups]
    bound = _lower_bound(sizes, spans)
    best: tuple[int, list[int], str] | None = None
    for ordering in ARENA_ORDERINGS:
        order = _order(ordering, sizes, spans)
        for fit in ARENA_FITS:
            offsets, top = _place(order, sizes, spans, fit)
            if best is None or top < best[0]:
                best = (top, offsets, f"{ordering}/{fit}")
            if top == bound:
                break
        if best is not None and best[0] == bound:
            break
    top, group_offsets, name = best if best else (0, [], "empty")
    placed = tuple(group_offsets[slot_of[i]] for i in range(len(buffers)))
    return ArenaPlan(buffers, placed, top, bound, name, tuple(inplace))


def _group_inplace(
    buffers: tuple[Buffer, ...],
) -> tuple[list[list[int]], list[int], list[tuple[int, int]]]:
    """Chain accepted in-place pairs into groups that share one slot (the root's size)."""
    slot_of = list(range(len(buffers)))
    groups: dict[int, list[int]] = {i: [i] for i in range(len(buffers))}
    taken: set[int] = set()
    inplace: list[tuple[int, int]] = []
    for i in sorted(range(len(buffers)), key=lambda k: buffers[k].first):
        src = buffers[i].inplace_of
        if src is None or src == i or not 0 <= src < len(buffers) or src in taken:
            continue
        root = slot_of[src]
        # A source that dies where it is born (first == last) would let the buffers before
        # and after it in a chain be live together in one slot: never reuse it.
        if buffers[src].first == buffers[src].last:
            continue
        if buffers[src].last != buffers[i].first or buffers[i].size > buffers[root].size:
            continue
        if align_up(buffers[i].size) > align_up(buffers[root].size) or groups[root][-1] != src:
            continue
        taken.add(src)
        inplace.append((i, src))
        members = groups.pop(slot_of[i])
        groups[root].extend(members)
        for m in members:
            slot_of[m] = root
    roots = sorted(groups)
    index = {root: k for k, root in enumerate(roots)}
    return [groups[r] for r in roots], [index[slot_of[i]] for i in range(len(buffers))], inplace


def _lower_bound(sizes: list[int], spans: list[tuple[int, int]]) -> int:
    events: dict[int, int] = {}
    for size, (first, last) in zip(sizes, spans):
        events[first] = events.get(first, 0) + size
        events[last + 1] = events.get(last + 1, 0) - size
    live = peak = 0
    for step in sorted(events):
        live += events[step]
        peak = max(peak, live)
    return peak


def _order(ordering: str, sizes: list[int], spans: list[tuple[int, int]]) -> list[int]:
    idx = range(len(sizes))
    life = [last - first + 1 for first, last in spans]
    keys = {
        "size": lambda i: (-sizes[i], -life[i], spans[i][0]),
        "lifetime": lambda i: (-life[i], -sizes[i], spans[i][0]),
        "area": lambda i: (-sizes[i] * life[i], -sizes[i], spans[i][0]),
        "first_use": lambda i: (spans[i][0], -sizes[i]),
        "last_use": lambda i: (-spans[i][1], -sizes[i]),
    }
    return sorted(idx, key=keys[ordering])


def _place(
    order: list[int], sizes: list[int], spans: list[tuple[int, int]], fit: str
) -> tuple[list[int], int]:
    """Greedy placement: each buffer goes into a gap among the time-overlapping buffers
    already placed (the smallest that fits for ``best``, the lowest for ``first``), else on
    top of them."""
    offsets = [0] * len(sizes)
    placed: list[int] = []
    top = 0
    for i in order:
        first, last = spans[i]
        busy = sorted(
            (offsets[j], offsets[j] + sizes[j])
            for j in placed
            if spans[j][0] <= last and first <= spans[j][1]
        )
        cursor = 0
        choice = None
        choice_room = 0
        for lo, hi in busy:
            room = lo - cursor
            if room >= sizes[i] and (choice is None or (fit == "best" and room < choice_room)):
                choice, choice_room = cursor, room
            cursor = max(cursor, hi)
        offsets[i] = cursor if choice is None else choice
        top = max(top, offsets[i] + sizes[i])
        placed.append(i)
    return offsets, top
