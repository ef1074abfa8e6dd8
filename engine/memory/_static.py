"""The static pool: fixed page sizes chosen ahead of time, pages never released.

This is the "before" behaviour the adaptive pools improve on, kept as a baseline for the
bench and the tests: sliced page classes for small and medium requests, an exclusive page per
large request (reused by any later request that fits), nothing ever handed back. Two layouts:
our own tight classes (``STATIC_SLICED_CLASSES``), and ``subslice_classes``, the layout Burn
used before its adaptive pools (CubeCL's ``SubSlices`` configuration), which the 0.22
release's figures were measured against.
"""

from __future__ import annotations

from ._block import Block, align_up
from ._constants import (
    ALIGNMENT,
    STATIC_SLICED_CLASSES,
    SUBSLICES_MIN_PAGE,
    SUBSLICES_PAGE_FRACTION,
)
from ._format import fmt_bytes
from ._pageset import PageSet
from ._source import PageSource
from ._stats import PoolStats


class StaticPool:
    """Size-class pools with fixed page sizes; never releases a page."""

    def __init__(
        self,
        source: PageSource,
        classes: tuple[tuple[int, int], ...] | None = None,
    ) -> None:
        """``classes``: (largest slice, page size) per sliced class, smallest first; None
        means ``STATIC_SLICED_CLASSES``."""
        classes = STATIC_SLICED_CLASSES if classes is None else classes
        self.source = source
        self._limits = [max_slice for max_slice, _ in classes]
        self._sets = [
            PageSet(f"static<={fmt_bytes(max_slice)}", source, page, keep_empty=None)
            for max_slice, page in classes
        ]
        self._exclusive = PageSet("static exclusive", source, 0, keep_empty=None, exclusive=True)

    def alloc(self, nbytes: int, movable: bool = False) -> Block:
        """Allocate `nbytes`; `movable` is accepted for interface parity and ignored."""
        if nbytes < 0:
            raise ValueError(f"cannot allocate a negative size ({nbytes} bytes)")
        self.source.check_use(nbytes)
        size = align_up(nbytes)
        for limit, pages in zip(self._limits, self._sets):
            if size <= limit:
                return pages.alloc(nbytes, size)
        return self._exclusive.alloc(nbytes, size)

    def free(self, block: Block) -> None:
        """Return a block; its page stays reserved forever."""
        block.pool.free(block)

    @property
    def page_sets(self) -> tuple[PageSet, ...]:
        return (*self._sets, self._exclusive)

    @property
    def reserved(self) -> int:
        return sum(s.reserved for s in self.page_sets)

    @property
    def in_use(self) -> int:
        return sum(s.in_use for s in self.page_sets)

    def stats(self) -> tuple[PoolStats, ...]:
        """One row per page class."""
        return tuple(s.stats() for s in self.page_sets)


def subslice_classes(device_memory: int) -> tuple[tuple[int, int], ...]:
    """(largest slice, page size) classes of the pre-adaptive Burn layout for a device with
    ``device_memory`` bytes, smallest first.

    The largest page is a quarter of the device; going down, each page class is a quarter of
    the one above (while that one is at least 32 MiB), and the k-th class down takes slices up
    to its page size / 2**k, so small requests share pages and big ones sit alone. E.g. 8 GiB:
    512 KiB slices on 8 MiB pages, 4 MiB on 32 MiB, 32 MiB on 128 MiB, 256 MiB on 512 MiB,
    then one 2 GiB class.
    """
    top = device_memory // SUBSLICES_PAGE_FRACTION // ALIGNMENT * ALIGNMENT
    if top <= 0:
        raise ValueError(f"device memory of {device_memory} bytes is too small for pages")
    classes = []
    page, divisor = top, 1
    while page >= SUBSLICES_MIN_PAGE:
        page = align_up(page // 4)
        divisor *= 2
        classes.append((page // divisor, page))
    return (*reversed(classes), (top, top))
