"""Memory statistics for a device without pools: live tensor bytes, counted as they come and go.

The CPU device runs on NumPy's own allocator by default (a pool would cost a copy per op
there); `memory_stats()` still answers, from the bytes of the tensors the device holds.
"""

from __future__ import annotations

from ._stats import MemoryStats, PoolStats

UNPOOLED = "unpooled"
"""The single row's name: the backend's own allocator, no pages of ours."""


class Accounting:
    """Running totals of held tensor bytes and their peak."""

    __slots__ = ("device", "in_use", "peak", "count")

    def __init__(self, device: str) -> None:
        self.device = device
        self.in_use = 0
        self.peak = 0
        self.count = 0

    def add(self, nbytes: int) -> None:
        self.in_use += nbytes
        self.count += 1
        if self.in_use > self.peak:
            self.peak = self.in_use

    def remove(self, nbytes: int) -> None:
        self.in_use -= nbytes
        self.count -= 1

    def stats(self) -> MemoryStats:
        row = PoolStats(UNPOOLED, self.in_use, self.in_use, self.peak, self.peak, self.count, 0, 0)
        return MemoryStats(
            self.device, self.in_use, self.in_use, self.peak, self.peak, None, (row,)
        )
