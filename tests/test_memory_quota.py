"""Quota: clear errors, nothing reserved on failure, the device usable afterwards."""

import numpy as np
import pytest
from burn_remote.engine.memory import (
    DeviceMemory,
    HostPageAllocator,
    MemoryQuotaExceeded,
    fmt_bytes,
    parse_bytes,
)
from hypothesis import given, settings
from hypothesis import strategies as st

MIB = 1 << 20


def test_error_names_request_in_use_and_limit():
    mem = DeviceMemory("cpu", HostPageAllocator(), limit=4 * MIB)
    keep = mem.alloc(3 * MIB)
    with pytest.raises(MemoryQuotaExceeded) as info:
        mem.alloc(2 * MIB)
    err = info.value
    assert (err.requested, err.in_use, err.limit) == (2 * MIB, 3 * MIB, 4 * MIB)
    text = str(err)
    for part in (
        "cpu",
        "2.0 MiB",
        str(2 * MIB),
        "3.0 MiB in use",
        "limit 4.0 MiB",
        "--memory-limit",
    ):
        assert part in text
    mem.free(keep)
    block = mem.alloc(2 * MIB)  # usable again
    block.view((2 * MIB // 4,), np.float32)[:] = 1.0
    assert mem.memory_stats().in_use == 2 * MIB


@settings(max_examples=80, deadline=None)
@given(
    st.integers(1, 16 * MIB),
    st.lists(st.one_of(st.integers(0, 3 * MIB), st.tuples(st.just("free"), st.integers(0, 99)))),
)
def test_quota_is_never_passed_and_failures_change_nothing(limit, seq):
    pages = HostPageAllocator()
    mem = DeviceMemory("cpu", pages, limit=limit)
    live = []
    for op in seq:
        if isinstance(op, tuple):
            if live:
                mem.free(live.pop(op[1] % len(live)))
            continue
        before = mem.memory_stats()
        try:
            live.append(mem.alloc(op))
        except MemoryQuotaExceeded as err:
            after = mem.memory_stats()
            assert after.in_use == before.in_use
            assert after.reserved <= before.reserved  # maybe spares released, never more
            assert err.requested == op and err.limit == limit
        stats = mem.memory_stats()
        assert stats.reserved == pages.outstanding_bytes <= limit
        assert stats.in_use == sum(b.nbytes for b in live) <= limit


def test_parse_bytes():
    assert parse_bytes("512MiB") == 512 * MIB
    assert parse_bytes("2G") == 2 << 30
    assert parse_bytes("1.5 GB") == 1_500_000_000
    assert parse_bytes("1048576") == MIB
    with pytest.raises(ValueError, match="byte size"):
        parse_bytes("lots")


def test_stats_print_readably():
    mem = DeviceMemory("cpu", HostPageAllocator(), limit=64 * MIB)
    mem.alloc(100)
    mem.alloc(3 * MIB)
    text = str(mem.memory_stats())
    assert "memory on cpu" in text and "limit 64.0 MiB" in text
    assert "small" in text and "large" in text
    assert fmt_bytes(1536) == "1.5 KiB" and fmt_bytes(12) == "12 B"
