"""The device's memory ledger: every pool reserves pages through it, so quota and totals live
in one place and the device-wide peaks are peaks of the sums, not sums of the peaks."""

from __future__ import annotations

from ._errors import MemoryQuotaExceeded
from ._pages import Page, PageAllocator


class PageSource:
    """A page allocator plus the device's quota and running totals."""

    def __init__(self, pages: PageAllocator, limit: int | None = None, device: str = "") -> None:
        if limit is not None and limit < 0:
            raise ValueError(f"memory limit must be >= 0 bytes, got {limit}")
        self.pages = pages
        self.limit = limit
        self.device = device
        self.reserved = 0
        self.in_use = 0
        self.peak_reserved = 0
        self.peak_in_use = 0

    def check_use(self, requested: int) -> None:
        """Raise MemoryQuotaExceeded if `requested` more bytes in use would pass the limit."""
        if self.limit is not None and self.in_use + requested > self.limit:
            raise self._quota_error(requested)

    def take(self, nbytes: int, requested: int) -> Page:
        """Reserve a page of `nbytes` for an allocation of `requested` bytes."""
        if self.limit is not None and self.reserved + nbytes > self.limit:
            raise self._quota_error(requested)
        page = self.pages.allocate(nbytes)
        self.reserved += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return page

    def give_back(self, page: Page) -> None:
        """Release a page to the device."""
        self.pages.release(page)
        self.reserved -= page.nbytes

    def note_use(self, delta: int) -> None:
        """Record bytes entering (+) or leaving (-) use."""
        self.in_use += delta
        self.peak_in_use = max(self.peak_in_use, self.in_use)

    def fits(self, nbytes: int) -> bool:
        """Whether a page of `nbytes` could be reserved under the quota right now."""
        return self.limit is None or self.reserved + nbytes <= self.limit

    def reset_peaks(self) -> None:
        """Start peak tracking again from the current values."""
        self.peak_reserved = self.reserved
        self.peak_in_use = self.in_use

    def _quota_error(self, requested: int) -> MemoryQuotaExceeded:
        assert self.limit is not None
        return MemoryQuotaExceeded(requested, self.in_use, self.reserved, self.limit, self.device)
