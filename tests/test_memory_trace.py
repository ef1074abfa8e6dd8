"""Trace replay: both policies see the same trace; results checked against the trace itself."""

import pytest
from burn_remote.engine.memory import (
    Alloc,
    Free,
    peak_live,
    replay,
    subslice_classes,
    transient_buffers,
)
from hypothesis import given, settings
from hypothesis import strategies as st

MIB = 1 << 20


def training_like(layers, act_bytes, param_bytes, steps):
    """Params live across steps (old ones freed early in the next step, as a client's Drop
    arrives); activations kept for backward; gradients short-lived."""
    ids = iter(range(10**9))
    params = [next(ids) for _ in range(layers)]
    setup = [Alloc(p, param_bytes) for p in params]
    out = []
    for _ in range(steps):
        step = []
        acts = []
        for k in range(layers):
            a = next(ids)
            step.append(Alloc(a, act_bytes * (1 + k % 3), transient=True))
            acts.append(a)
        new = []
        for k in reversed(range(layers)):
            g = next(ids)
            step.append(Alloc(g, param_bytes, transient=True))
            step.append(Free(acts[k]))
            n = next(ids)
            step.append(Alloc(n, param_bytes))
            step.append(Free(g))
            step.append(Free(params[k]))
            new.append(n)
        params = new[::-1]
        out.append(step)
    return setup, out


def test_replay_reports_against_the_floor():
    setup, steps = training_like(6, 3 * MIB, 1 * MIB, 4)
    floor = peak_live([setup, *steps])
    static = replay(steps, "static", setup)
    adaptive = replay(steps, "adaptive", setup)
    assert static.peak_live == adaptive.peak_live == floor
    assert static.peak_reserved >= floor and adaptive.peak_reserved >= floor
    assert adaptive.arena_lower_bound <= adaptive.arena_bytes
    assert adaptive.peak_reserved <= static.peak_reserved
    assert adaptive.steady_page_allocs <= static.steady_page_allocs + len(steps) * 6


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 4 * MIB), st.booleans(), st.integers(0, 5)),
        max_size=40,
    ),
    st.integers(1, 3),
)
def test_random_traces_never_go_below_the_floor(spec, repeats):
    steps = []
    next_id = 0
    for _ in range(repeats):
        step, open_ = [], []
        for nbytes, transient, frees in spec:
            step.append(Alloc(next_id, nbytes, transient))
            open_.append(next_id)
            next_id += 1
            for _ in range(min(frees, len(open_))):
                step.append(Free(open_.pop(0)))
        step += [Free(i) for i in open_]
        steps.append(step)
    floor = peak_live(steps)
    for policy in ("static", "adaptive"):
        result = replay(steps, policy)
        assert result.peak_live == floor
        assert result.peak_reserved >= floor
    ids, buffers = transient_buffers(steps[0]) if steps else ([], [])
    assert len(ids) == len(buffers)


def test_subslice_layout_matches_the_pre_adaptive_burn_pages():
    GIB = 1024 * MIB
    assert subslice_classes(8 * GIB) == (
        (512 * 1024, 8 * MIB),
        (4 * MIB, 32 * MIB),
        (32 * MIB, 128 * MIB),
        (256 * MIB, 512 * MIB),
        (2 * GIB, 2 * GIB),
    )
    for memory in (1 * GIB, 3 * GIB + 12345, 24 * GIB, 141 * GIB):
        classes = subslice_classes(memory)
        assert classes[-1][1] <= memory // 4
        assert all(s <= p for s, p in classes)
        assert [p for _, p in classes] == sorted(p for _, p in classes)
    with pytest.raises(ValueError, match="too small"):
        subslice_classes(100)


def test_subslice_static_pool_replays_and_never_releases():
    setup, steps = training_like(6, 3 * MIB, 1 * MIB, 4)
    layout = subslice_classes(8 * 1024 * MIB)
    old = replay(steps, "static", setup, static_classes=layout)
    assert old.peak_live == peak_live([setup, *steps])
    assert old.steady_page_allocs == 0  # pages reserved in the first step are kept and reused
    # 3 MiB buffers land in the 4 MiB class of 32 MiB pages: whole pages, not 3 MiB blocks.
    assert old.peak_reserved % (8 * MIB) == 0 and old.peak_reserved >= 32 * MIB
    assert replay(steps, "adaptive", setup).peak_reserved <= old.peak_reserved
