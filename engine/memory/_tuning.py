"""Choosing the large-page size from a dry run: replay the recorded trace against candidate
page sizes (virtually, no memory touched) and keep the best.

Replaying is exact where rules of thumb are not: the cost of a page size depends on the order
of allocations and frees, which the trace has and a size histogram does not.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._block import align_up
from ._constants import (
    LARGE_PAGE_MAX_BYTES,
    LARGE_PAGE_MIN_BYTES,
    PAGE_SIZE_CANDIDATE_FACTORS,
    PAGE_SIZE_QUANTILES,
    TUNE_RESERVE_SLACK,
)
from ._pages import VirtualPageAllocator
from ._pageset import PageSet
from ._source import PageSource

Event = tuple[str, int, int]
"""("alloc", id, aligned size) or ("free", id, 0)."""


@dataclass(frozen=True)
class PageChoice:
    """One candidate page size and what replaying the dry run with it cost."""

    page_bytes: int
    """0 means an exact-size page per allocation (the dry run's own policy)."""
    peak_reserved: int
    page_allocs: int


def simulate(events: list[Event], page_bytes: int) -> PageChoice:
    """Replay `events` into a large-page set with `page_bytes` pages, on virtual memory."""
    pages = PageSet("sim", PageSource(VirtualPageAllocator()), page_bytes, keep_empty=0)
    live = {}
    for kind, ident, size in events:
        if kind == "alloc":
            live[ident] = pages.alloc(size, size)
        else:
            pages.free(live.pop(ident))
    return PageChoice(page_bytes, pages.peak_reserved, pages.page_allocs)


def candidate_sizes(sizes: list[int], exact: bool = True) -> list[int]:
    """Page sizes worth trying: multiples of the size quantiles, clamped and aligned; with
    `exact`, also 0 (a page per allocation)."""
    if not sizes:
        return [0] if exact else [LARGE_PAGE_MIN_BYTES]
    ordered = sorted(sizes)
    seeds = {
        ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1)))] for q in PAGE_SIZE_QUANTILES
    }
    out = {0} if exact else set()
    for seed in seeds:
        for factor in PAGE_SIZE_CANDIDATE_FACTORS:
            size = min(LARGE_PAGE_MAX_BYTES, max(LARGE_PAGE_MIN_BYTES, seed * factor))
            out.add(align_up(size, LARGE_PAGE_MIN_BYTES))
    return sorted(out)


def choose_page_size(events: list[Event], exact: bool = True) -> PageChoice:
    """The candidate with the fewest page reservations among those whose peak reserve is
    within TUNE_RESERVE_SLACK of the best; ties go to the smaller page. `exact=False` leaves
    out exact-size pages (devices whose allocator rounds small reservations up anyway)."""
    sizes = [size for kind, _, size in events if kind == "alloc"]
    results = [simulate(events, size) for size in candidate_sizes(sizes, exact)]
    best_peak = min(r.peak_reserved for r in results)
    ok = [r for r in results if r.peak_reserved <= best_peak * (1 + TUNE_RESERVE_SLACK)]
    return min(ok, key=lambda r: (r.page_allocs, r.peak_reserved, r.page_bytes))
