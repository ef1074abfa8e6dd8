"""Page allocators: where pool pages come from.

A page is one contiguous reservation from a device. Pools carve blocks out of pages, so the
page allocator is the only code that talks to the device's real allocator; swapping it swaps
host memory (NumPy), device memory (CuPy) or no memory at all (planning and simulation).
"""

from __future__ import annotations

import itertools
import math
import weakref
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ._constants import ALIGNMENT


@dataclass(eq=False)
class Page:
    """One reservation from a page allocator. Identity is the object, not its fields."""

    id: int
    """Unique per allocator, for stats and debugging."""
    nbytes: int
    """Usable bytes, starting at `address`."""
    address: int
    """Start address (real for host and device memory, made up for virtual pages)."""
    handle: Any = field(default=None, repr=False)
    """The backing object: a uint8 ndarray (host), a cupy MemoryPointer (device), or None."""


@runtime_checkable
class PageAllocator(Protocol):
    """Hands out and takes back pages; knows how to view and copy bytes inside them."""

    name: str

    def allocate(self, nbytes: int) -> Page:
        """Reserve `nbytes` (a multiple of ALIGNMENT), aligned; may raise MemoryError."""
        ...

    def release(self, page: Page) -> None:
        """Give the page back to the device. The page must not be used afterwards."""
        ...

    def view(self, page: Page, offset: int, shape: tuple[int, ...], dtype: Any) -> Any:
        """An array of `shape`/`dtype` over the page's bytes from `offset` (no copy)."""
        ...

    def copy(self, dst: Page, dst_offset: int, src: Page, src_offset: int, nbytes: int) -> None:
        """Copy bytes between (possibly the same) pages; ranges may not overlap."""
        ...

    @property
    def outstanding_bytes(self) -> int:
        """Bytes in pages allocated and not yet released."""
        ...


class _CountingAllocator:
    """Bookkeeping shared by the allocators: live pages and their bytes."""

    def __init__(self) -> None:
        self._ids = itertools.count()
        self._live: dict[int, Page] = {}

    @property
    def outstanding_bytes(self) -> int:
        return sum(p.nbytes for p in self._live.values())

    @property
    def outstanding_pages(self) -> int:
        return len(self._live)

    def _forget(self, page: Page) -> None:
        if self._live.pop(page.id, None) is not page:
            raise ValueError(f"page {page.id} is not live in this allocator")


class HostPageAllocator(_CountingAllocator):
    """Pages in host memory for the NumPy backend; tensors are NumPy views into them.

    Each page is a fresh uint8 buffer, over-allocated by ALIGNMENT and trimmed to an aligned
    start. `release` drops the allocator's reference; the memory returns to the OS as soon as
    no view into it survives, which `alive_buffers()` lets tests check.
    """

    name = "host"

    def __init__(self) -> None:
        super().__init__()
        self._raw_refs: list[weakref.ref[np.ndarray]] = []

    def allocate(self, nbytes: int) -> Page:
        raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
        shift = (-raw.ctypes.data) % ALIGNMENT
        buf = raw[shift : shift + nbytes]
        page = Page(next(self._ids), nbytes, buf.ctypes.data, buf)
        self._live[page.id] = page
        self._raw_refs.append(weakref.ref(raw))
        return page

    def release(self, page: Page) -> None:
        self._forget(page)
        page.handle = None

    def view(self, page: Page, offset: int, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        dt = dtype if type(dtype) is np.dtype else np.dtype(dtype)
        count = math.prod(shape)
        flat = page.handle[offset : offset + count * dt.itemsize].view(dt)
        return flat.reshape(shape)

    def copy(self, dst: Page, dst_offset: int, src: Page, src_offset: int, nbytes: int) -> None:
        dst.handle[dst_offset : dst_offset + nbytes] = src.handle[src_offset : src_offset + nbytes]

    def alive_buffers(self) -> int:
        """Raw buffers still in memory (live pages plus released pages a view still pins)."""
        self._raw_refs = [r for r in self._raw_refs if r() is not None]
        return len(self._raw_refs)


class VirtualPageAllocator(_CountingAllocator):
    """Pages with addresses but no memory: for replaying traces and tuning page sizes.

    Addresses never repeat, so overlap checks between blocks stay meaningful.
    """

    name = "virtual"

    def __init__(self) -> None:
        super().__init__()
        self._next_address = ALIGNMENT

    def allocate(self, nbytes: int) -> Page:
        page = Page(next(self._ids), nbytes, self._next_address)
        self._next_address += nbytes + ALIGNMENT
        self._live[page.id] = page
        return page

    def release(self, page: Page) -> None:
        self._forget(page)

    def view(self, page: Page, offset: int, shape: tuple[int, ...], dtype: Any) -> Any:
        raise TypeError("virtual pages hold no memory to view")

    def copy(self, dst: Page, dst_offset: int, src: Page, src_offset: int, nbytes: int) -> None:
        """Nothing to copy: virtual pages have no contents."""
