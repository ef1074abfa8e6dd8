"""Device memory for the CuPy backend, and installing pools as CuPy's allocator.

CuPy is imported only when one of these is used, so the NumPy engine never needs it.
Pages come straight from cudaMalloc (`cupy.cuda.memory.Memory`), never through CuPy's own
allocator, so installing the pool as CuPy's allocator cannot recurse.

CuPy has one allocator per process, so one dispatcher is installed and routes each request
to the pool of the device that is current (a process serving cuda:0 and cuda:1 keeps their
pools apart; a device without a pool gets CuPy's default pool).

Blocks are stream-ordered, like CuPy's own pool: a freed block may still be read by kernels
queued on the stream that allocated it, so it goes back to the pool at once only for that
stream. Other streams get it after an event recorded on its stream has completed (one event
per stream per check, not per free), or after a synchronise when the pool would otherwise
run out. Pool state is guarded by one lock: jobs and sessions allocate from worker threads.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
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


class _StreamFrees:
    """Blocks freed while kernels on one stream may still use them."""

    __slots__ = ("stream", "blocks", "event", "covered")

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.blocks: deque[tuple[Any, Any]] = deque()  # (memory, block); appended by finalizers
        self.event: Any = None  # recorded on `stream`; when done, the first `covered` are free
        self.covered = 0


class CupyAllocator:
    """The one allocator installed in CuPy: per-device pools, stream-ordered frees, a lock.

    Args:
        cp: the CuPy module.
    """

    def __init__(self, cp: Any) -> None:
        self.cp = cp
        self.memories: dict[int, Any] = {}
        """Device id -> the pool CuPy allocates from there (the last installed)."""
        self._installed: dict[int, list[Any]] = {}
        self.lock = threading.Lock()
        self._frees: dict[int, _StreamFrees] = {}
        self.cross_stream_waits = 0
        """Times a pool ran short and waited for other streams' frees (a synchronise)."""

    # --- CuPy's side ---------------------------------------------------------------------
    def malloc(self, nbytes: int) -> Any:
        cp = self.cp
        device_id = cp.cuda.runtime.getDevice()
        memory = self.memories.get(device_id)
        if memory is None:  # a device without a pool: CuPy's own
            return cp.get_default_memory_pool().malloc(nbytes)
        stream = self._stream()
        with self.lock:
            self._collect(stream)
            try:
                block = memory.alloc(nbytes)
            except MemoryError:  # the device (or the quota) is full: give back what waits
                self._wait_all()
                memory.release_idle_arenas()
                memory.pool.relieve()  # retained empty pages too
                block = memory.alloc(nbytes)
        lease = _Lease()
        weakref.finalize(lease, self._release, memory, block, stream)
        raw = cp.cuda.UnownedMemory(block.address, max(nbytes, 1), lease, device_id)
        return cp.cuda.MemoryPointer(raw, 0)

    def _release(self, memory: Any, block: Any, stream: Any) -> None:
        """A block CuPy let go of (any thread, maybe inside a malloc through the GC)."""
        if self._stream().ptr == stream.ptr and self.lock.acquire(blocking=False):
            try:  # freed on its own stream: later work there is ordered after its readers
                memory.free(block)
            finally:
                self.lock.release()
            return
        frees = self._frees.get(stream.ptr)
        if frees is None:
            frees = self._frees.setdefault(stream.ptr, _StreamFrees(stream))
        frees.blocks.append((memory, block))

    # --- ordering ------------------------------------------------------------------------
    def _stream(self) -> Any:
        return self.cp.cuda.get_current_stream()

    def _collect(self, stream: Any) -> None:
        """Return what is safe for an allocation on `stream` (call with the lock held)."""
        for ptr, frees in list(self._frees.items()):
            if ptr == stream.ptr:
                self._give_back(frees, len(frees.blocks))
                frees.event, frees.covered = None, 0
            elif frees.event is not None and frees.event.done:
                self._give_back(frees, frees.covered)
                frees.event, frees.covered = None, 0
            if frees.event is None and frees.blocks:
                frees.event = self.cp.cuda.Event(block=False, disable_timing=True)
                frees.event.record(frees.stream)
                frees.covered = len(frees.blocks)

    def _wait_all(self) -> bool:
        """Wait for every stream that holds freed blocks, return them all; whether any was."""
        waited = False
        for frees in self._frees.values():
            if frees.blocks:
                frees.stream.synchronize()
                self._give_back(frees, len(frees.blocks))
                waited = True
            frees.event, frees.covered = None, 0
        self.cross_stream_waits += waited
        return waited

    @staticmethod
    def _give_back(frees: _StreamFrees, count: int) -> None:
        for _ in range(count):
            memory, block = frees.blocks.popleft()
            memory.free(block)

    def pending(self) -> int:
        """Blocks freed by CuPy and not yet back in a pool."""
        return sum(len(f.blocks) for f in self._frees.values())

    def collect(self) -> None:
        """Return every block that is safe for the current stream (before reading stats)."""
        with self.lock:
            self._collect(self._stream())


_INSTALLED: CupyAllocator | None = None


def install_cupy_allocator(memory: Any) -> CupyAllocator:
    """Make CuPy allocate from `memory` (a DeviceMemory over a CupyPageAllocator) on that
    memory's device, so CuPy's own kernels and temporaries count in the pools, the stats and
    the quota. Other devices keep what they had."""
    global _INSTALLED
    cp = _cupy()
    if _INSTALLED is None or _INSTALLED.cp is not cp:
        _INSTALLED = CupyAllocator(cp)
    device_id = memory.source.pages.device_id
    _INSTALLED._installed.setdefault(device_id, []).append(memory)
    _INSTALLED.memories[device_id] = memory
    cp.cuda.set_allocator(_INSTALLED.malloc)
    return _INSTALLED


def installed_allocator() -> CupyAllocator | None:
    """The dispatcher installed in CuPy, if any."""
    return _INSTALLED


def uninstall_cupy_allocator(memory: Any = None) -> None:
    """Take `memory` off the dispatcher (its device goes back to the pool installed before
    it, if any); None takes every pool off. With none left, CuPy gets its default pool."""
    global _INSTALLED
    cp = _cupy()
    if _INSTALLED is not None:
        if memory is None:
            _INSTALLED._installed.clear()
        else:
            stack = _INSTALLED._installed.get(memory.source.pages.device_id, [])
            if memory in stack:
                stack.remove(memory)
        _INSTALLED.memories = {d: s[-1] for d, s in _INSTALLED._installed.items() if s}
        if _INSTALLED.memories:
            return
    _INSTALLED = None
    cp.cuda.set_allocator(cp.get_default_memory_pool().malloc)
