"""Immutable memory statistics: what `dev.memory_stats()` returns."""

from dataclasses import dataclass

from ._format import fmt_bytes


@dataclass(frozen=True)
class PoolStats:
    """One pool's counters at the moment of the snapshot."""

    name: str
    """Which pool: ``small``, ``large``, ``static``, ``arena:<graph>`` ..."""
    reserved: int
    """Bytes held from the page allocator (the device) right now."""
    in_use: int
    """Bytes requested by live allocations (before alignment padding)."""
    peak_reserved: int
    """Highest `reserved` since the pool was made (or since `reset_peaks`)."""
    peak_in_use: int
    """Highest `in_use` since the pool was made (or since `reset_peaks`)."""
    pages: int
    """Pages held right now."""
    page_allocs: int
    """Pages ever reserved from the page allocator: each is a driver call on a GPU."""
    page_releases: int
    """Pages ever handed back to the page allocator."""


@dataclass(frozen=True)
class MemoryStats:
    """A device's memory: totals over its pools, their peaks, and one row per pool.

    The totals' peaks are taken over the device as a whole, so `peak_reserved` can be lower
    than the sum of the pools' own peaks (they need not peak at the same time).
    """

    device: str
    """The device these numbers describe, e.g. ``cpu`` or ``cuda:0``."""
    reserved: int
    """Bytes held from the device by all pools."""
    in_use: int
    """Bytes requested by live allocations in all pools."""
    peak_reserved: int
    """Highest total `reserved` seen."""
    peak_in_use: int
    """Highest total `in_use` seen."""
    limit: int | None
    """The quota in bytes (``--memory-limit``), or None when unlimited."""
    pools: tuple[PoolStats, ...]
    """One row per pool."""

    def __str__(self) -> str:
        limit = "none" if self.limit is None else fmt_bytes(self.limit)
        head = (
            f"memory on {self.device}: reserved {fmt_bytes(self.reserved)} "
            f"(peak {fmt_bytes(self.peak_reserved)}), in use {fmt_bytes(self.in_use)} "
            f"(peak {fmt_bytes(self.peak_in_use)}), limit {limit}"
        )
        cols = ("pool", "reserved", "in use", "peak reserved", "peak in use", "pages")
        rows = [cols] + [
            (
                p.name,
                fmt_bytes(p.reserved),
                fmt_bytes(p.in_use),
                fmt_bytes(p.peak_reserved),
                fmt_bytes(p.peak_in_use),
                str(p.pages),
            )
            for p in self.pools
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
        lines = [
            "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
            for r in rows
        ]
        return "\n".join([head, *("  " + line for line in lines)])
