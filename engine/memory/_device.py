"""A device's memory: the ledger, one pool, and the arenas of cached graphs, behind one face.

Backends and the executor talk to this object only; `memory_stats()` is what
`dev.memory_stats()` returns.
"""

from __future__ import annotations

from typing import Literal

from ._adaptive import AdaptivePool
from ._arena import ArenaPlan
from ._block import Block
from ._pages import Page, PageAllocator
from ._source import PageSource
from ._static import StaticPool
from ._stats import MemoryStats, PoolStats


class Arena:
    """One reservation holding a cached graph's planned buffers at their planned offsets.

    The page is reserved on first use and kept between replays (that is what makes a replay
    allocation-free); `release()` hands it back, e.g. under quota pressure or on eviction.
    """

    def __init__(self, name: str, plan: ArenaPlan, source: PageSource) -> None:
        self.name = name
        self.plan = plan
        self.source = source
        self.page: Page | None = None
        self.in_use = 0
        self.peak_in_use = 0
        self.peak_reserved = 0
        self.page_allocs = 0
        self.page_releases = 0
        self._live: dict[int, Block] = {}
        self._index: dict[int, int] = {}

    def alloc(self, index: int, nbytes: int | None = None) -> Block:
        """The block of planned buffer `index` (`nbytes` defaults to the planned size)."""
        planned = self.plan.buffers[index].size
        nbytes = planned if nbytes is None else nbytes
        if nbytes > planned:
            raise ValueError(f"buffer {index} needs {nbytes} bytes, the plan has {planned}")
        if index in self._live:
            raise ValueError(f"buffer {index} is already live in arena {self.name}")
        if self.page is None:
            self.page = self.source.take(max(self.plan.size, 1), nbytes)
            self.page_allocs += 1
            self.peak_reserved = max(self.peak_reserved, self.page.nbytes)
        block = Block(self.page, self.plan.offsets[index], nbytes, planned, self, self.source.pages)
        self._live[index] = block
        self._index[id(block)] = index
        self.in_use += nbytes
        self.peak_in_use = max(self.peak_in_use, self.in_use)
        self.source.note_use(nbytes)
        return block

    def free(self, block: Block) -> None:
        """End a planned buffer's life; its bytes stay reserved for the next replay."""
        index = self._index.pop(id(block), None)
        if index is None or self._live.get(index) is not block:
            raise ValueError("block is not live in this arena")
        del self._live[index]
        self.in_use -= block.nbytes
        self.source.note_use(-block.nbytes)

    def release(self) -> int:
        """Hand the arena's page back if no buffer is live; returns the bytes released."""
        if self.page is None or self._live:
            return 0
        nbytes = self.page.nbytes
        self.source.give_back(self.page)
        self.page = None
        self.page_releases += 1
        return nbytes

    @property
    def reserved(self) -> int:
        return 0 if self.page is None else self.page.nbytes

    def stats(self) -> PoolStats:
        return PoolStats(
            f"arena:{self.name}",
            self.reserved,
            self.in_use,
            self.peak_reserved,
            self.peak_in_use,
            0 if self.page is None else 1,
            self.page_allocs,
            self.page_releases,
        )


class DeviceMemory:
    """The memory of one device: quota, pool (adaptive by default) and graph arenas.

    Args:
        device: the device's name for stats and errors, e.g. ``cpu``.
        pages: where pages come from (host, CuPy, or virtual memory).
        limit: quota in bytes (``--memory-limit``), or None.
        pool: ``adaptive`` (default) or ``static`` (the baseline, for comparisons).
        static_classes: the static pool's page classes (see ``StaticPool``), if not the
            default ones.
        retain: the adaptive pool keeps the reserve its dry runs reached (see
            ``AdaptivePool``); the CUDA backend asks for it.
    """

    def __init__(
        self,
        device: str,
        pages: PageAllocator,
        limit: int | None = None,
        pool: Literal["adaptive", "static"] = "adaptive",
        static_classes: tuple[tuple[int, int], ...] | None = None,
        retain: bool = False,
    ) -> None:
        self.device = device
        self.source = PageSource(pages, limit, device)
        self.pool: AdaptivePool | StaticPool = (
            AdaptivePool(self.source, retain=retain)
            if pool == "adaptive"
            else StaticPool(self.source, static_classes)
        )
        self.arenas: dict[str, Arena] = {}

    def alloc(self, nbytes: int, movable: bool = False) -> Block:
        """Allocate from the pool; under quota pressure idle arenas are released first."""
        try:
            return self.pool.alloc(nbytes, movable)
        except MemoryError:
            if not self.release_idle_arenas():
                raise
            return self.pool.alloc(nbytes, movable)

    def free(self, block: Block) -> None:
        """Return a block to whichever pool or arena it came from."""
        if isinstance(block.pool, Arena):
            block.pool.free(block)
        else:
            self.pool.free(block)

    def arena(self, name: str, plan: ArenaPlan) -> Arena:
        """The arena for a cached graph, made on first request (its page on first use)."""
        arena = self.arenas.get(name)
        if arena is None or arena.plan is not plan:
            if arena is not None:
                arena.release()
            arena = self.arenas[name] = Arena(name, plan, self.source)
        return arena

    def drop_arena(self, name: str) -> None:
        """Forget a graph's arena (the graph was evicted)."""
        arena = self.arenas.pop(name, None)
        if arena is not None:
            arena.release()

    def release_idle_arenas(self) -> int:
        """Release the pages of arenas with nothing live; returns the bytes released."""
        return sum(a.release() for a in self.arenas.values())

    def begin_dry_run(self) -> None:
        """Start gathering allocation statistics (adaptive pool only)."""
        if isinstance(self.pool, AdaptivePool):
            self.pool.begin_dry_run()

    def end_dry_run(self) -> None:
        """Size pages from the statistics just gathered and compact what can move."""
        if isinstance(self.pool, AdaptivePool) and self.pool.recording:
            self.pool.end_dry_run()
            self.pool.compact()

    def reset_peaks(self) -> None:
        """Start peak tracking again from now (pools and device totals)."""
        self.source.reset_peaks()
        for pages in self.pool.page_sets:
            pages.reset_peaks()
        for arena in self.arenas.values():
            arena.peak_reserved, arena.peak_in_use = arena.reserved, arena.in_use

    def memory_stats(self) -> MemoryStats:
        """Reserved, in use, their peaks, and a row per pool and arena."""
        rows = (*self.pool.stats(), *(a.stats() for a in self.arenas.values()))
        s = self.source
        return MemoryStats(
            self.device, s.reserved, s.in_use, s.peak_reserved, s.peak_in_use, s.limit, rows
        )
