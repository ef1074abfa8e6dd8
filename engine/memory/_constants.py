"""Every size, alignment and threshold the memory pools use, named in one place.

Why one module: the pools, the arena planner, the bench and the tests must agree on these
numbers, and a reader tuning memory behaviour should find all knobs without grepping.
"""

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

ALIGNMENT = 256
"""Byte alignment of every block: cudaMalloc's guarantee, a multiple of every dtype's size and
of a cache line, so a view is valid for any dtype and vectorised kernels stay aligned."""

# --- adaptive pool -------------------------------------------------------------------------

SMALL_ALLOC_MAX = 16 * KIB
"""Allocations up to this size live in the small-allocation pool, away from large pages, so
scalars and tiny temporaries that come and go every op cannot fragment the large pages."""

SMALL_PAGE_BYTES = 256 * KIB
"""Page size of the small-allocation pool (16 of the largest small allocations)."""

SMALL_EMPTY_PAGES_KEPT = 1
"""Empty small pages kept instead of released: one spare stops a page from being released and
re-reserved on every op when a single small tensor comes and goes."""

LARGE_PAGE_MIN_BYTES = 2 * MIB
"""Smallest page the tuner may choose for large allocations."""

LARGE_PAGE_MAX_BYTES = 512 * MIB
"""Largest page the tuner may choose; bigger allocations get a page of their own anyway."""

PAGE_SIZE_CANDIDATE_FACTORS = (1, 2, 3, 4, 6, 8)
"""Candidate page sizes are these multiples of the dry run's large-allocation size quantiles;
the tuner replays the dry run against each and keeps the one with the lowest peak reserve."""

PAGE_SIZE_QUANTILES = (0.5, 0.9, 1.0)
"""Quantiles of the dry run's large-allocation sizes that seed the candidate page sizes."""

COMPACT_MAX_OCCUPANCY = 0.5
"""Compaction only tries to empty pages at most this full: moving a nearly full page costs
copies for little gain."""

# --- static baseline (the behaviour before adaptive pools) -------------------------------

STATIC_SLICED_CLASSES = ((64 * KIB, 1 * MIB), (4 * MIB, 32 * MIB))
"""(largest slice, page size) of the static pool's sliced page classes: fixed sizes chosen
ahead of time, the way the old static configuration did, never from statistics."""

# Allocations above the last sliced class get an exclusive page of their own, reused by any
# later allocation that fits; static pages are never released.

SUBSLICES_PAGE_FRACTION = 4
"""The pre-adaptive Burn (CubeCL ``SubSlices``) layout sizes its largest page as the device's
memory divided by this, then derives the smaller page classes from it (``subslice_classes``)."""

SUBSLICES_MIN_PAGE = 32 * MIB
"""That layout keeps dividing its page size by four while the page is at least this big."""

# --- arena planner -------------------------------------------------------------------------

ARENA_ORDERINGS = ("size", "lifetime", "area", "first_use", "last_use")
"""Buffer orderings the arena planner tries; the smallest arena wins."""

TUNE_RESERVE_SLACK = 0.0
"""The tuner accepts a page size whose replayed peak reserve is up to this fraction above the
best candidate's, if it needs fewer page reservations (each is a driver call on a GPU)."""

ARENA_FITS = ("best", "first")
"""Gap choices the arena planner tries for each ordering: the tightest gap, or the lowest."""
