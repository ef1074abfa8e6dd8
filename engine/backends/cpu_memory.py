"""glibc's malloc told to keep the CPU engine's freed array memory for the next array.

A step of a real-sized model makes and drops hundreds of intermediate arrays of 1-32 MiB.
Left to its defaults, glibc serves each with a fresh ``mmap`` (above its dynamic threshold)
or gives a freed heap top back to the kernel (trim), so every new array page-faults each
4 KiB page on its first write. Measured on this project's 2-core VM: ``e / (1 + e)`` over a
3 MiB float32 array took 7 ms with the faults and 0.4 ms without; a SmolLM2-135M LoRA step
5.7 -> 4.4 s and a GPT-2-small AdamW step 2.9 -> 2.7 s.

``keep_freed_memory`` sets two documented ``mallopt`` parameters: blocks up to
``MMAP_THRESHOLD`` come from the heap (and go back to it when freed), and the heap's free top
is kept up to ``TRIM_THRESHOLD``. The cost is that a process keeps the memory its largest
step used; ``release_freed_memory`` (``malloc_trim``) hands it back, and the server calls it
when a session closes and, while sessions run, whenever malloc keeps more free memory than
its recent steps need (``release_kept_above``: a long-running server's heap otherwise keeps
every hole its tensors of many sizes left, and its RSS climbs). ``BURN_REMOTE_KEEP_FREED=0``
leaves malloc as it was. On a C library other than glibc these calls do nothing.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

KEEP_FREED_ENV = "BURN_REMOTE_KEEP_FREED"
"""``0``: leave glibc's malloc settings as they are (the CPU engine then page-faults on most
new intermediate arrays)."""

MMAP_THRESHOLD = 32 * 2**20
"""Blocks up to this size come from the heap: glibc's largest allowed value on 64-bit
(``DEFAULT_MMAP_THRESHOLD_MAX``); larger arrays still get their own mapping."""

TRIM_THRESHOLD = 2**30
"""Free memory at the heap's top that malloc keeps rather than returning to the kernel."""

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""``mallopt`` parameter numbers (glibc's malloc.h)."""

_state: dict[str, Any] = {"libc": None, "kept": False}


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (malloc.h, glibc 2.33 and later): every field a size_t."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
            "fordblks", "keepcost",
        )
    ]  # fmt: skip


def _glibc() -> Any:
    """The C library when it is glibc (it has ``mallopt`` and ``malloc_trim``), else None."""
    if _state["libc"] is None:
        libc: Any = False
        try:
            lib = ctypes.CDLL(None)  # the interpreter's own symbols, its C library's among them
            if hasattr(lib, "mallopt") and hasattr(lib, "malloc_trim"):
                libc = lib
        except OSError:
            pass
        _state["libc"] = libc
    return _state["libc"] or None


def keep_freed_memory() -> bool:
    """Set the malloc parameters above once per process (unless ``BURN_REMOTE_KEEP_FREED=0``);
    True when they are in effect."""
    if _state["kept"]:
        return True
    if os.environ.get(KEEP_FREED_ENV, "1").strip() == "0":
        return False
    libc = _glibc()
    if libc is None:
        return False
    if libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1:
        return False
    libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    _state["kept"] = True
    return True


def release_freed_memory() -> None:
    """Give the memory malloc kept back to the kernel (a closed session's arrays); nothing
    when ``keep_freed_memory`` did not take effect."""
    if _state["kept"]:
        _glibc().malloc_trim(0)


def kept_free_bytes() -> int | None:
    """Bytes malloc holds free in its heaps (``mallinfo2().fordblks``, all arenas): what
    ``release_freed_memory`` would hand back. None when the settings are not in effect or
    this glibc has no ``mallinfo2``."""
    libc = _glibc() if _state["kept"] else None
    info = getattr(libc, "mallinfo2", None)
    if info is None:
        return None
    info.restype = _MallInfo2
    return int(info().fordblks)


def release_kept_above(keep: int) -> int:
    """Hand the kept memory back when malloc holds more than ``keep`` bytes free; the bytes
    the process's resident set shrank by (0: nothing was done, or the free chunks' pages had
    gone back already: malloc still counts a released hole as free until it is reused).
    ``malloc_trim`` releases the free pages of every arena, its holes included (about 17 ms
    for 300 MiB here; another thread's malloc waits while its arena is trimmed); it runs
    without the GIL (a ctypes call), so call it from a worker thread, not an event loop."""
    free = kept_free_bytes()
    if free is None or free <= keep:
        return 0
    before = _resident_bytes()
    _glibc().malloc_trim(0)
    return max(0, before - _resident_bytes())


def _resident_bytes() -> int:
    """This process's resident set (Linux: /proc/self/statm, in pages)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
