"""The ring schedule (engine/collective/ring.py) against NumPy: every rank ends with the sum
(or mean), bit-identical across ranks, for odd sizes, sizes below and not divisible by the
number of ranks, pieces smaller than chunks, and every dtype all_reduce takes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from burn_remote.engine.collective import ring

DTYPES = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int32, np.int64]


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("count", [0, 1, 2, 7, 1001, 4096])
def test_sum_matches_numpy(size, count):
    rng = np.random.default_rng(count * 10 + size)
    xs = [rng.standard_normal(count).astype(np.float64) for _ in range(size)]
    outs = ring.simulate(xs, "sum", piece_bytes=64)  # many pieces per chunk
    want = np.sum(xs, axis=0)
    for out in outs:
        np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
        assert out.tobytes() == outs[0].tobytes()  # one summation per element, then copies


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_dtypes(dtype):
    rng = np.random.default_rng(1)
    xs = [(rng.standard_normal((5, 7)) * 8).astype(dtype) for _ in range(3)]
    outs = ring.simulate(xs, "sum", piece_bytes=16)
    want = np.sum([x.astype(np.float64) for x in xs], axis=0)
    tol = {np.float16: 2e-2, ml_dtypes.bfloat16: 1e-1}.get(dtype, 1e-6)
    for out in outs:
        assert out.dtype == np.dtype(dtype) and out.shape == (5, 7)
        np.testing.assert_allclose(out.astype(np.float64), want, rtol=tol, atol=tol * 8)


def test_mean_divides_once_after_the_sum():
    xs = [np.full(10, v, np.float32) for v in (1.0, 2.0, 6.0)]
    for out in ring.simulate(xs, "mean", piece_bytes=8):
        np.testing.assert_array_equal(out, np.full(10, 3.0, np.float32))


def test_inputs_are_not_written():
    xs = [np.arange(9, dtype=np.float32) for _ in range(3)]
    ring.simulate(xs, "sum")
    np.testing.assert_array_equal(xs[0], np.arange(9, dtype=np.float32))


@pytest.mark.parametrize("size", [2, 3, 4, 7])
def test_each_rank_sends_two_chunks_worth_and_forwards_what_it_received(size):
    count, item = 1000, 4
    sent = [ring.Plan(r, size, count, item, piece_bytes=100).sends() for r in range(size)]
    for r in range(size):
        total = sum(b - a for _, a, b in sent[r])
        # bandwidth-optimal: 2 (n - 1) / n of the tensor, give or take a chunk's rounding
        assert abs(total - 2 * (size - 1) * count / size) <= 2 * (size - 1)
        steps = ring.schedule(r, size)
        for k in range(1, len(steps)):
            assert steps[k].send == steps[k - 1].receive
        # what rank r receives is exactly what its predecessor sends, piece for piece
        pred = ring.Plan((r - 1) % size, size, count, item, piece_bytes=100)
        mine = ring.Plan(r, size, count, item, piece_bytes=100).receives()
        assert [(k, a, b) for k, a, b, _ in mine] == pred.sends()


def test_chunk_bounds_cover_exactly():
    for count in range(0, 20):
        for size in range(1, 6):
            bounds = ring.chunk_bounds(count, size)
            assert bounds[0][0] == 0 and bounds[-1][1] == count
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
            lengths = [b - a for a, b in bounds]
            assert max(lengths) - min(lengths) <= 1
