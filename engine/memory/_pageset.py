"""A set of pages of one size class: best-fit placement, a release policy, compaction.

Both pools are built from page sets: the static pool from fixed-size sets that never release,
the adaptive pool from a small-allocation set and a large set whose page size is tuned.
"""

from __future__ import annotations

from ._block import Block, FreeRanges
from ._constants import COMPACT_MAX_OCCUPANCY
from ._pages import Page
from ._source import PageSource
from ._stats import PoolStats


class PageSet:
    """Pages of `page_bytes` (or larger, for allocations that do not fit one) and their blocks.

    Args:
        name: row name in the statistics.
        source: the device ledger pages are reserved from.
        page_bytes: size of a new page; 0 means every allocation gets an exact-size page.
        keep_empty: empty pages kept for reuse before releasing; None never releases.
        exclusive: one allocation per page (a freed page is reused by any request that fits).
    """

    def __init__(
        self,
        name: str,
        source: PageSource,
        page_bytes: int,
        keep_empty: int | None,
        exclusive: bool = False,
    ) -> None:
        self.name = name
        self.source = source
        self.page_bytes = page_bytes
        self.keep_empty = keep_empty
        self.exclusive = exclusive
        self.keep_bytes = 0
        """Empty pages are kept, whatever `keep_empty` says, while the set reserves no more
        than this: the reserve a dry run showed the work needs (see AdaptivePool `retain`)."""
        self._free: dict[Page, FreeRanges] = {}
        self._blocks: dict[Page, set[Block]] = {}
        self.reserved = 0
        self.in_use = 0
        self.peak_reserved = 0
        self.peak_in_use = 0
        self.page_allocs = 0
        self.page_releases = 0

    # --- allocation ------------------------------------------------------------------------

    def alloc(self, nbytes: int, size: int) -> Block:
        """Place `size` aligned bytes for a request of `nbytes`, reserving a page if needed."""
        found = self._best_fit(size)
        if found is None:
            page = self._new_page(size, nbytes)
            offset = 0
        else:
            page, offset = found
        block = Block(
            page, offset, nbytes, page.nbytes if self.exclusive else size, self, self.source.pages
        )
        self._free[page].take(offset, block.size)
        self._blocks[page].add(block)
        self._count_use(nbytes)
        return block

    def free(self, block: Block) -> None:
        """Return a block's bytes to its page; release the page if policy says so."""
        page = block.page
        self._blocks[page].remove(block)
        ranges = self._free[page]
        ranges.put(block.offset, block.size)
        self._count_use(-block.nbytes)
        if ranges.empty and self.keep_empty is not None and self.reserved > self.keep_bytes:
            empties = sum(1 for r in self._free.values() if r.empty)
            if empties > self.keep_empty:
                self._release(page)

    def release_empty(self) -> int:
        """Release every empty page (even kept spares); returns the bytes released."""
        before = self.reserved
        for page in [p for p, r in self._free.items() if r.empty]:
            self._release(page)
        return before - self.reserved

    def _best_fit(self, size: int) -> tuple[Page, int] | None:
        best: tuple[Page, int] | None = None
        best_room = 0
        for page, ranges in self._free.items():
            if self.exclusive:
                if (
                    ranges.empty
                    and page.nbytes >= size
                    and (best is None or page.nbytes < best_room)
                ):
                    best, best_room = (page, 0), page.nbytes
                continue
            offset = ranges.best_fit(size)
            if offset is None:
                continue
            room = ranges._sizes[offset]
            if best is None or room < best_room:
                best, best_room = (page, offset), room
        return best

    def _new_page(self, size: int, nbytes: int) -> Page:
        want = max(self.page_bytes, size)
        try:
            page = self.source.take(want, nbytes)
        except MemoryError:
            if want == size:
                raise
            page = self.source.take(size, nbytes)  # a full page would pass the quota: fit tight
        self._free[page] = FreeRanges(page.nbytes)
        self._blocks[page] = set()
        self.reserved += page.nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.page_allocs += 1
        return page

    def _release(self, page: Page) -> None:
        del self._free[page]
        del self._blocks[page]
        self.reserved -= page.nbytes
        self.page_releases += 1
        self.source.give_back(page)

    def _count_use(self, delta: int) -> None:
        self.in_use += delta
        self.peak_in_use = max(self.peak_in_use, self.in_use)
        self.source.note_use(delta)

    # --- compaction ------------------------------------------------------------------------

    def compact(self) -> int:
        """Move movable blocks out of sparse pages into free space elsewhere, then release the
        pages so emptied. Only pages whose every block can be moved are touched, so the
        reservation only goes down. Returns the bytes released."""
        if self.exclusive:
            return 0
        before = self.reserved
        candidates = sorted(
            (p for p, r in self._free.items() if not r.empty),
            key=lambda p: p.nbytes - self._free[p].free_bytes,
        )
        emptied: set[Page] = set()
        for page in candidates:
            used = page.nbytes - self._free[page].free_bytes
            if used > COMPACT_MAX_OCCUPANCY * page.nbytes:
                break
            blocks = sorted(self._blocks[page], key=lambda b: -b.size)
            if not all(b.movable for b in blocks):
                continue
            moves = self._place_elsewhere(blocks, exclude=emptied | {page})
            if moves is None:
                continue
            for block, (dst, dst_offset) in zip(blocks, moves):
                self._move(block, dst, dst_offset)
            emptied.add(page)
            self._release(page)
        return before - self.reserved

    def _place_elsewhere(
        self, blocks: list[Block], exclude: set[Page]
    ) -> list[tuple[Page, int]] | None:
        placed: list[tuple[Page, int, int]] = []
        for block in blocks:
            best: tuple[Page, int] | None = None
            best_room = 0
            for page, ranges in self._free.items():
                if page in exclude:
                    continue
                offset = ranges.best_fit(block.size)
                if offset is not None and (best is None or ranges._sizes[offset] < best_room):
                    best, best_room = (page, offset), ranges._sizes[offset]
            if best is None:
                for page, offset, size in placed:
                    self._free[page].put(offset, size)
                return None
            self._free[best[0]].take(best[1], block.size)
            placed.append((best[0], best[1], block.size))
        return [(page, offset) for page, offset, _ in placed]

    def _move(self, block: Block, dst: Page, dst_offset: int) -> None:
        """Copy a block's bytes to an already-taken range and repoint the handle."""
        src = block.page
        self.source.pages.copy(dst, dst_offset, src, block.offset, block.nbytes)
        self._free[src].put(block.offset, block.size)
        self._blocks[src].remove(block)
        self._blocks[dst].add(block)
        block.page, block.offset = dst, dst_offset
        block.moves += 1

    # --- statistics ------------------------------------------------------------------------

    @property
    def pages(self) -> int:
        return len(self._free)

    def live_blocks(self) -> list[Block]:
        """Every live block (for checks and diagnostics)."""
        return [b for blocks in self._blocks.values() for b in blocks]

    def stats(self) -> PoolStats:
        return PoolStats(
            self.name,
            self.reserved,
            self.in_use,
            self.peak_reserved,
            self.peak_in_use,
            self.pages,
            self.page_allocs,
            self.page_releases,
        )

    def reset_peaks(self) -> None:
        self.peak_reserved = self.reserved
        self.peak_in_use = self.in_use
