"""Blocks: the handles pools hand out, and the page-level bookkeeping of free ranges."""

from __future__ import annotations

import bisect
from typing import Any

from ._constants import ALIGNMENT
from ._pages import Page, PageAllocator


def align_up(n: int, alignment: int = ALIGNMENT) -> int:
    """Round `n` up to a multiple of `alignment` (at least one alignment unit)."""
    return max(alignment, -(-n // alignment) * alignment)


class Block:
    """A live allocation: `size` aligned bytes at `offset` in `page`, `nbytes` of them asked for.

    A block is a handle, not an array: compaction may move it to another page (it updates
    `page` and `offset` and bumps `moves`), so holders of movable blocks take views after the
    last compaction, never keep them across one.
    """

    __slots__ = ("page", "offset", "nbytes", "size", "pool", "movable", "moves", "_pages")

    def __init__(
        self, page: Page, offset: int, nbytes: int, size: int, pool: Any, pages: PageAllocator
    ) -> None:
        self.page = page
        self.offset = offset
        self.nbytes = nbytes
        self.size = size
        self.pool = pool
        self.movable = False
        self.moves = 0
        self._pages = pages

    @property
    def address(self) -> int:
        """Absolute start address (for overlap and alignment checks)."""
        return self.page.address + self.offset

    def view(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """An array of `shape` and `dtype` over this block's bytes (no copy)."""
        return self._pages.view(self.page, self.offset, tuple(shape), dtype)

    def __repr__(self) -> str:
        return f"Block(page={self.page.id}, offset={self.offset}, nbytes={self.nbytes})"


class FreeRanges:
    """Free byte ranges of one page, kept sorted and coalesced; best-fit allocation.

    Best fit (the smallest free range that holds the request) leaves large ranges whole for
    large requests, which is what keeps page counts low when sizes vary a lot.
    """

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self._starts: list[int] = [0]
        self._sizes: dict[int, int] = {0: nbytes}
        self.free_bytes = nbytes

    @property
    def empty(self) -> bool:
        """True when nothing is allocated in the page."""
        return self.free_bytes == self.nbytes

    def largest(self) -> int:
        """Size of the largest free range (0 when full)."""
        return max(self._sizes.values(), default=0)

    def best_fit(self, size: int) -> int | None:
        """Offset of the smallest free range holding `size`, or None; does not take it."""
        best = None
        best_size = 0
        for start in self._starts:
            s = self._sizes[start]
            if s >= size and (best is None or s < best_size):
                best, best_size = start, s
                if s == size:
                    break
        return best

    def take(self, offset: int, size: int) -> None:
        """Mark [offset, offset+size) used; it must lie at the start of a free range."""
        free = self._sizes.pop(offset)
        i = bisect.bisect_left(self._starts, offset)
        del self._starts[i]
        if free > size:
            self._sizes[offset + size] = free - size
            self._starts.insert(i, offset + size)
        self.free_bytes -= size

    def put(self, offset: int, size: int) -> None:
        """Mark [offset, offset+size) free again, merging with free neighbours."""
        i = bisect.bisect_left(self._starts, offset)
        end = offset + size
        if i < len(self._starts) and self._starts[i] == end:
            size += self._sizes.pop(end)
            del self._starts[i]
        if i > 0:
            prev = self._starts[i - 1]
            if prev + self._sizes[prev] == offset:
                self._sizes[prev] += size
                self.free_bytes += end - offset
                return
        self._starts.insert(i, offset)
        self._sizes[offset] = size
        self.free_bytes += end - offset
