"""Memory for engine backends: page allocators, adaptive and static pools, arena planning,
statistics and quota.

Everything public is re-exported here from private modules; import from this package.
"""

from ._accounting import Accounting
from ._adaptive import AdaptivePool
from ._arena import ArenaPlan, Buffer, plan_arena
from ._block import Block, align_up
from ._constants import ALIGNMENT, SMALL_ALLOC_MAX
from ._cupy import (
    CupyAllocator,
    CupyPageAllocator,
    install_cupy_allocator,
    installed_allocator,
    uninstall_cupy_allocator,
)
from ._device import Arena, DeviceMemory
from ._errors import MemoryQuotaExceeded
from ._format import fmt_bytes, parse_bytes
from ._graph import GraphMemory, GraphRun
from ._pages import HostPageAllocator, Page, PageAllocator, VirtualPageAllocator
from ._source import PageSource
from ._static import StaticPool, subslice_classes
from ._stats import MemoryStats, PoolStats
from ._trace import Alloc, Event, Free, ReplayResult, peak_live, replay, transient_buffers
from ._tuning import PageChoice, choose_page_size

__all__ = [
    "Accounting",
    "ALIGNMENT",
    "SMALL_ALLOC_MAX",
    "AdaptivePool",
    "Alloc",
    "Arena",
    "ArenaPlan",
    "Block",
    "Buffer",
    "CupyAllocator",
    "CupyPageAllocator",
    "DeviceMemory",
    "Event",
    "Free",
    "GraphMemory",
    "GraphRun",
    "HostPageAllocator",
    "MemoryQuotaExceeded",
    "MemoryStats",
    "Page",
    "PageAllocator",
    "PageChoice",
    "PageSource",
    "PoolStats",
    "ReplayResult",
    "StaticPool",
    "subslice_classes",
    "VirtualPageAllocator",
    "align_up",
    "choose_page_size",
    "fmt_bytes",
    "install_cupy_allocator",
    "installed_allocator",
    "parse_bytes",
    "peak_live",
    "plan_arena",
    "replay",
    "transient_buffers",
    "uninstall_cupy_allocator",
]
