"""The adaptive pool: small allocations apart, large pages sized from a dry run, empty pages
released, live blocks compacted when that frees a page.

Until a dry run has been seen, every large allocation gets an exact-size page that is released
when freed: reserved memory equals live memory, at the price of one page reservation per
allocation. That is the right policy for a run whose shape is unknown, and it records the
trace the tuner needs. After `end_dry_run`, large allocations share pages of the tuned size.
"""

from __future__ import annotations

from ._block import Block, align_up
from ._constants import (
    LARGE_PAGE_MIN_BYTES,
    SMALL_ALLOC_MAX,
    SMALL_EMPTY_PAGES_KEPT,
    SMALL_PAGE_BYTES,
)
from ._errors import MemoryQuotaExceeded
from ._pageset import PageSet
from ._source import PageSource
from ._stats import PoolStats
from ._tuning import Event, PageChoice, choose_page_size

RETAIN_ALL = 1 << 62
"""`keep_bytes` while a retaining pool's dry run records: no page is released."""


class AdaptivePool:
    """Small-allocation pool + large pool with tuned pages, releasing and compacting.

    Args:
        source: the device ledger (page allocator and quota).
        small_max: requests up to this many bytes go to the small pool.
        retain: keep the reserve a dry run reached: no page is released during a dry run,
            and afterwards empty pages are released only above that reserve (or under quota
            pressure); large pages are never smaller than LARGE_PAGE_MIN_BYTES (cudaMalloc's
            own granularity). For devices where reserving and releasing a page is a
            synchronising driver call (cudaMalloc/cudaFree), so a replayed step reserves
            nothing.
    """

    def __init__(
        self, source: PageSource, small_max: int = SMALL_ALLOC_MAX, retain: bool = False
    ) -> None:
        self.source = source
        self.retain = retain
        self.small_max = small_max
        self.small = PageSet("small", source, SMALL_PAGE_BYTES, keep_empty=SMALL_EMPTY_PAGES_KEPT)
        self.large = PageSet("large", source, LARGE_PAGE_MIN_BYTES if retain else 0, keep_empty=0)
        self.choice: PageChoice | None = None
        self._trace: list[Event] | None = None
        self._ids: dict[int, int] = {}
        self._serial = 0

    # --- allocation ------------------------------------------------------------------------

    def alloc(self, nbytes: int, movable: bool = False) -> Block:
        """Allocate `nbytes` (aligned to ALIGNMENT).

        Args:
            nbytes: bytes requested.
            movable: the holder re-takes views after `compact()`, so the block may be moved.

        Raises:
            MemoryQuotaExceeded: the device limit would be passed even after releasing spare
                pages and compacting; nothing was reserved, the pool is unchanged.
        """
        if nbytes < 0:
            raise ValueError(f"cannot allocate a negative size ({nbytes} bytes)")
        self.source.check_use(nbytes)
        size = align_up(nbytes)
        pages = self.small if size <= self.small_max else self.large
        try:
            block = pages.alloc(nbytes, size)
        except MemoryQuotaExceeded:
            if not self.relieve():
                raise
            block = pages.alloc(nbytes, size)
        block.movable = movable
        if self._trace is not None and pages is self.large:
            self._ids[id(block)] = self._serial
            self._trace.append(("alloc", self._serial, size))
            self._serial += 1
        return block

    def free(self, block: Block) -> None:
        """Return a block; a page left empty is released (small pool: beyond one spare)."""
        if self._trace is not None and block.pool is self.large and id(block) in self._ids:
            self._trace.append(("free", self._ids.pop(id(block)), 0))
        block.pool.free(block)

    def relieve(self) -> int:
        """Release spare empty pages, then compact; returns the bytes given back."""
        return self.small.release_empty() + self.large.release_empty() + self.compact()

    def compact(self) -> int:
        """Move movable blocks out of sparse pages so those pages can be released."""
        return self.small.compact() + self.large.compact()

    # --- dry run and tuning ----------------------------------------------------------------

    def begin_dry_run(self) -> None:
        """Start recording large allocations; blocks already live count as allocated first."""
        self._trace = []
        self._ids = {}
        self._serial = 0
        if self.retain:
            for pages in self.page_sets:
                pages.keep_bytes = RETAIN_ALL
        for block in self.large.live_blocks():
            self._ids[id(block)] = self._serial
            self._trace.append(("alloc", self._serial, block.size))
            self._serial += 1

    def end_dry_run(self) -> PageChoice:
        """Stop recording and size large pages from the trace (see `_tuning`)."""
        trace, self._trace = self._trace or [], None
        self._ids = {}
        self.choice = choose_page_size(trace, exact=not self.retain)
        self.large.page_bytes = self.choice.page_bytes
        if self.retain:  # nothing was released during the run: `reserved` is its high water
            for pages in self.page_sets:
                pages.keep_bytes = pages.reserved
        return self.choice

    @property
    def recording(self) -> bool:
        return self._trace is not None

    # --- statistics ------------------------------------------------------------------------

    @property
    def page_sets(self) -> tuple[PageSet, ...]:
        return (self.small, self.large)

    @property
    def reserved(self) -> int:
        return self.small.reserved + self.large.reserved

    @property
    def in_use(self) -> int:
        return self.small.in_use + self.large.in_use

    def stats(self) -> tuple[PoolStats, ...]:
        """One row for the small pool, one for the large pool."""
        return (self.small.stats(), self.large.stats())
