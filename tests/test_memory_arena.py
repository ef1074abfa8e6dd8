"""Arena plans checked against liveness by a brute-force oracle written independently."""

from burn_remote.engine.memory import ALIGNMENT, Buffer, plan_arena
from hypothesis import given, settings
from hypothesis import strategies as st


def aligned(n):
    return max(ALIGNMENT, -(-n // ALIGNMENT) * ALIGNMENT)


@st.composite
def buffer_lists(draw):
    n = draw(st.integers(0, 40))
    out = []
    for i in range(n):
        first = draw(st.integers(0, 30))
        last = first + draw(st.integers(0, 10))
        hint = draw(st.one_of(st.none(), st.integers(0, max(0, i - 1)))) if i else None
        out.append(Buffer(draw(st.integers(0, 5000)), first, last, hint))
    return out


def live_at(buffers, step):
    return [i for i, b in enumerate(buffers) if b.first <= step <= b.last]


@settings(max_examples=200, deadline=None)
@given(buffer_lists())
def test_plans_never_overlap_live_buffers(buffers):
    plan = plan_arena(buffers)
    plan.verify()
    pairs = set(plan.inplace)
    for i, j in pairs:  # accepted in-place pairs are safe by construction
        assert buffers[i].inplace_of == j
        assert buffers[j].last == buffers[i].first
        assert plan.offsets[i] == plan.offsets[j]  # they share bytes; the checks below
        # (arena bounds and no overlap among other live buffers) make that safe
    steps = {s for b in buffers for s in (b.first, b.last)}
    for step in steps:
        ids = live_at(buffers, step)
        for a in ids:
            assert plan.offsets[a] % ALIGNMENT == 0
            assert plan.offsets[a] + aligned(buffers[a].size) <= plan.size
            for b in ids:
                if a >= b or (a, b) in pairs or (b, a) in pairs:
                    continue
                lo_a, hi_a = plan.offsets[a], plan.offsets[a] + aligned(buffers[a].size)
                lo_b, hi_b = plan.offsets[b], plan.offsets[b] + aligned(buffers[b].size)
                assert hi_a <= lo_b or hi_b <= lo_a, f"{a} and {b} overlap at step {step}"


@settings(max_examples=200, deadline=None)
@given(buffer_lists())
def test_size_between_bound_and_total(buffers):
    plan = plan_arena([Buffer(b.size, b.first, b.last) for b in buffers])
    bound = max(
        (sum(aligned(buffers[i].size) for i in live_at(buffers, s)) for s in range(0, 41)),
        default=0,
    )
    assert plan.lower_bound == bound
    assert bound <= plan.size <= sum(aligned(b.size) for b in buffers)


def test_disjoint_lifetimes_share_one_slot():
    buffers = [Buffer(1000 * (k + 1), k, k) for k in range(5)]
    plan = plan_arena(buffers)
    assert plan.size == plan.lower_bound == aligned(5000)
    assert set(plan.offsets) == {0}


def test_inplace_chain_shares_the_slot():
    buffers = [Buffer(4096, 0, 1), Buffer(4096, 1, 2, inplace_of=0), Buffer(4096, 2, 3, 1)]
    plan = plan_arena(buffers)
    assert plan.inplace == ((1, 0), (2, 1))
    assert plan.size == 4096 and len(set(plan.offsets)) == 1


def test_inplace_refused_when_unsafe():
    # 1 is born while 0 still has a later reader: not the last use, so no sharing.
    buffers = [Buffer(4096, 0, 3), Buffer(4096, 1, 2, inplace_of=0)]
    plan = plan_arena(buffers)
    assert plan.inplace == ()
    assert plan.size == 8192


def test_empty_plan():
    plan = plan_arena([])
    assert plan.size == 0 and plan.lower_bound == 0
