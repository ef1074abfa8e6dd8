"""Device memory for the CuPy backend, and installing a pool as CuPy's allocator.

CuPy is imported only when one of these is used, so the NumPy engine never needs it.
Pages come straight from cudaMalloc (`cupy.cuda.memory.Memory`), never through CuPy's own
allocator, so installing the pool as CuPy's allocator cannot recurse.
"""

from __future__ import annotations

import weakref
from typing import Any

from ._pages import Page, _CountingAllocator

_CUDA_MEMCPY_DEVICE_TO_DEVICE = 3
"""cudaMemcpyKind value for device-to-device copies."""


def _cupy() -> Any:
    try:
        import cupy
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise RuntimeError("the cuda backend needs CuPy: pip install 'burn-remote[cuda]'") from exc
    return cupy


class CupyPageAllocator(_CountingAllocator):
    """Pages of device memory on one CUDA device (256-byte aligned by cudaMalloc)."""

    name = "cuda"

    def __init__(self, device_id: int = 0) -> None:
        super().__init__()
        self.device_id = device_id

    def allocate(self, nbytes: int) -> Page:
        cp = _cupy()
        with cp.cuda.Device(self.device_id):
            mem = cp.cuda.memory.Memory(nbytes)
        page = Page(next(self._ids), nbytes, int(mem.ptr), mem)
        self._live[page.id] = page
        return page

    def release(self, page: Page) -> None:
        self._forget(page)
        page.handle = None  # cudaFree runs when CuPy's Memory object is collected

    def view(self, page: Page, offset: int, shape: tuple[int, ...], dtype: Any) -> Any:
        cp = _cupy()
        return cp.ndarray(shape, dtype, memptr=cp.cuda.MemoryPointer(page.handle, offset))

    def copy(self, dst: Page, dst_offset: int, src: Page, src_offset: int, nbytes: int) -> None:
        cp = _cupy()
        with cp.cuda.Device(self.device_id):
            cp.cuda.runtime.memcpy(
                dst.address + dst_offset,
                src.address + src_offset,
                nbytes,
                _CUDA_MEMCPY_DEVICE_TO_DEVICE,
            )


class _Lease:
    """Owner object handed to CuPy with each allocation; when CuPy drops the memory, the
    lease dies and its finalizer returns the block to the pool."""

    __slots__ = ("__weakref__",)


def install_cupy_allocator(memory: Any) -> None:
    """Make CuPy allocate from `memory` (a DeviceMemory over a CupyPageAllocator), so CuPy's
    own kernels and temporaries count in the pools, the stats and the quota."""
    cp = _cupy()
    device_id = memory.source.pages.device_id

    def malloc(nbytes: int) -> Any:
        block = memory.alloc(nbytes)
        lease = _Lease()
        weakref.finalize(lease, memory.free, block)
        raw = cp.cuda.UnownedMemory(block.address, max(nbytes, 1), lease, device_id)
        return cp.cuda.MemoryPointer(raw, 0)

    cp.cuda.set_allocator(malloc)


def uninstall_cupy_allocator() -> None:
    """Give CuPy its default memory pool back."""
    cp = _cupy()
    cp.cuda.set_allocator(cp.get_default_memory_pool().malloc)
