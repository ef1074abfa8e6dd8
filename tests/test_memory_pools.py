"""Property tests for the pools: random allocate/free sequences against a plain-Python oracle."""

import numpy as np
import pytest
from burn_remote.engine.memory import (
    ALIGNMENT,
    AdaptivePool,
    HostPageAllocator,
    PageSource,
    StaticPool,
)
from hypothesis import given, settings
from hypothesis import strategies as st

KIB = 1024
# Sizes straddle the small-pool threshold and the static classes; a few are page-sized.
sizes = st.one_of(
    st.integers(0, 4 * KIB),
    st.integers(4 * KIB, 128 * KIB),
    st.integers(128 * KIB, 3 * 1024 * KIB),
)
# An op is an allocation size, or ("free", k): free the k-th live block (mod live count).
ops = st.lists(st.one_of(sizes, st.tuples(st.just("free"), st.integers(0, 1000))), max_size=60)


def make(kind):
    pages = HostPageAllocator()
    source = PageSource(pages)
    pool = StaticPool(source) if kind == "static" else AdaptivePool(source)
    return pages, source, pool


def fill(block, tag):
    view = block.view((block.nbytes,), np.uint8)
    view[:] = tag % 251


def check_invariants(pool, pages, source, live):
    blocks = [b for b, _ in live]
    spans = sorted((b.address, b.address + b.size) for b in blocks)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start, "two live blocks overlap"
    for b in blocks:
        assert b.address % ALIGNMENT == 0
        assert b.size >= b.nbytes and b.size % ALIGNMENT == 0
        assert b.offset + b.size <= b.page.nbytes
    assert pool.in_use == sum(b.nbytes for b in blocks) == source.in_use
    assert pool.reserved == pages.outstanding_bytes == source.reserved
    for b, tag in live:
        assert (b.view((b.nbytes,), np.uint8) == tag % 251).all(), "block contents changed"


def run(kind, seq, movable=False, compact_every=0):
    pages, source, pool = make(kind)
    live = []
    peak_in_use = peak_reserved = 0
    for n, op in enumerate(seq):
        if isinstance(op, tuple):
            if not live:
                continue
            block, _ = live.pop(op[1] % len(live))
            pool.free(block)
        else:
            block = pool.alloc(op, movable=movable)
            fill(block, n)
            live.append((block, n))
        if compact_every and n % compact_every == 0 and kind == "adaptive":
            before = pool.reserved
            pool.compact()
            assert pool.reserved <= before
        peak_in_use = max(peak_in_use, sum(b.nbytes for b, _ in live))
        peak_reserved = max(peak_reserved, pages.outstanding_bytes)
        check_invariants(pool, pages, source, live)
        if kind == "adaptive":
            assert all(not r.empty for r in pool.large._free.values()), "empty large page kept"
    assert source.peak_in_use == peak_in_use
    assert source.peak_reserved == peak_reserved
    rows = pool.stats()
    assert sum(r.in_use for r in rows) == pool.in_use
    assert sum(r.reserved for r in rows) == pool.reserved
    return pages, source, pool, live


@settings(max_examples=60, deadline=None)
@given(ops, st.sampled_from(["static", "adaptive"]))
def test_random_sequences_keep_invariants(seq, kind):
    run(kind, seq)


@settings(max_examples=60, deadline=None)
@given(ops)
def test_compaction_keeps_contents_and_never_grows(seq):
    run("adaptive", seq, movable=True, compact_every=3)


@settings(max_examples=40, deadline=None)
@given(ops)
def test_released_pages_are_really_returned(seq):
    pages, source, pool, live = run("adaptive", seq)
    while live:
        pool.free(live.pop()[0])
    pool.small.release_empty()
    assert pool.reserved == source.reserved == 0
    assert pages.outstanding_pages == 0
    assert pages.alive_buffers() == 0, "a released page's memory is still alive"


@settings(max_examples=40, deadline=None)
@given(ops)
def test_static_pool_never_releases(seq):
    pages, source, pool, live = run("static", seq)
    before = pages.outstanding_bytes
    for block, _ in live:
        pool.free(block)
    assert pool.in_use == 0
    assert pages.outstanding_bytes == before


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(64 * KIB + 1, 2048 * KIB), min_size=1, max_size=30))
def test_dry_run_tuning_keeps_invariants(sizes_):
    pages, source, pool = make("adaptive")
    pool.begin_dry_run()
    blocks = [pool.alloc(s) for s in sizes_]
    for b in blocks[::2]:
        pool.free(b)
    choice = pool.end_dry_run()
    assert choice.page_bytes == pool.large.page_bytes
    assert choice.page_bytes == 0 or choice.page_bytes % ALIGNMENT == 0
    more = [pool.alloc(s) for s in sizes_]
    live = blocks[1::2] + more
    spans = sorted((b.address, b.address + b.size) for b in live)
    assert all(e <= s for (_, e), (s, _) in zip(spans, spans[1:]))
    assert pool.in_use == sum(b.nbytes for b in live)


def test_small_allocations_stay_out_of_large_pages():
    _, _, pool = make("adaptive")
    small = pool.alloc(100)
    large = pool.alloc(1 << 20)
    assert small.pool is pool.small and large.pool is pool.large
    assert small.page is not large.page


def test_negative_size_is_refused():
    _, _, pool = make("adaptive")
    with pytest.raises(ValueError, match="negative"):
        pool.alloc(-1)


def test_views_are_typed_and_aligned():
    _, _, pool = make("adaptive")
    block = pool.alloc(12 * 8)
    view = block.view((3, 4), np.float64)
    assert view.shape == (3, 4) and view.dtype == np.float64
    assert view.ctypes.data % ALIGNMENT == 0
    view[:] = 2.5
    assert block.view((12,), np.float64).sum() == 30.0
