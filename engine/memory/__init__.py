"""Memory for engine backends: page allocators, adaptive and static pools, arena planning,
statistics and quota.

Everything public is re-exported here from private modules; import from this package.
"""

# What a CPU device needs at its start (its ledger, its errors) loads now; the pools, arena
# planning and traces on first use (see __getattr__): `Device.cpu()` opens without them.
from typing import TYPE_CHECKING

from ...protocol.lazy import lazy_names
from ._accounting import Accounting
from ._errors import MemoryQuotaExceeded
from ._format import fmt_bytes, parse_bytes
from ._stats import MemoryStats, PoolStats

_LAZY = {
    # name: the private module that holds it
    "AdaptivePool": "._adaptive",
    "ArenaPlan": "._arena",
    "Buffer": "._arena",
    "plan_arena": "._arena",
    "Block": "._block",
    "align_up": "._block",
    "ALIGNMENT": "._constants",
    "SMALL_ALLOC_MAX": "._constants",
    "CupyAllocator": "._cupy",
    "CupyPageAllocator": "._cupy",
    "install_cupy_allocator": "._cupy",
    "installed_allocator": "._cupy",
    "uninstall_cupy_allocator": "._cupy",
    "Arena": "._device",
    "DeviceMemory": "._device",
    "GraphMemory": "._graph",
    "GraphRun": "._graph",
    "HostPageAllocator": "._pages",
    "Page": "._pages",
    "PageAllocator": "._pages",
    "VirtualPageAllocator": "._pages",
    "PageSource": "._source",
    "StaticPool": "._static",
    "subslice_classes": "._static",
    "Alloc": "._trace",
    "Event": "._trace",
    "Free": "._trace",
    "ReplayResult": "._trace",
    "peak_live": "._trace",
    "replay": "._trace",
    "transient_buffers": "._trace",
    "PageChoice": "._tuning",
    "choose_page_size": "._tuning",
}
"""Public names loaded on first use."""


__getattr__, __dir__ = lazy_names(__name__, globals(), _LAZY)


if TYPE_CHECKING:  # for type checkers: the names as if imported eagerly
    from ._adaptive import AdaptivePool  # noqa: F401
    from ._arena import ArenaPlan, Buffer, plan_arena  # noqa: F401
    from ._block import Block, align_up  # noqa: F401
    from ._constants import ALIGNMENT, SMALL_ALLOC_MAX  # noqa: F401
    from ._cupy import (  # noqa: F401
        CupyAllocator,
        CupyPageAllocator,
        install_cupy_allocator,
        installed_allocator,
        uninstall_cupy_allocator,
    )
    from ._device import Arena, DeviceMemory  # noqa: F401
    from ._graph import GraphMemory, GraphRun  # noqa: F401
    from ._pages import HostPageAllocator, Page, PageAllocator, VirtualPageAllocator  # noqa: F401
    from ._source import PageSource  # noqa: F401
    from ._static import StaticPool, subslice_classes  # noqa: F401
    from ._trace import Alloc, Event, Free, ReplayResult, peak_live, replay, transient_buffers  # noqa: F401
    from ._tuning import PageChoice, choose_page_size  # noqa: F401


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
