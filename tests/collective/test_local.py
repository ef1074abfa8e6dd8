"""Local replicas all-reduce in memory: values against NumPy, bit-identical ranks, graphs
that replay under br.compile, gradients through the op, and failures (late rank, mismatched
calls, closed group) as GroupError on every rank instead of a hang."""

from __future__ import annotations

import time

import burn_remote as br
import numpy as np
import pytest
from burn_remote import collective as C


@pytest.fixture
def devs():
    return C.local_devices(3)


def test_sum_and_mean_match_numpy_and_are_identical(devs):
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((17, 3)).astype(np.float32) for _ in devs]
    with C.Group(devs) as g:
        sums = [C.all_reduce(d.tensor(x), g, "sum") for d, x in zip(devs, xs)]
        means = [C.all_reduce(d.tensor(x), g, "mean") for d, x in zip(devs, xs)]
        got = [t.numpy() for t in sums]  # a read on rank 0 first: the others are flushed
        np.testing.assert_allclose(got[0], np.sum(xs, axis=0), rtol=1e-6)
        assert all(g_.tobytes() == got[0].tobytes() for g_ in got)
        np.testing.assert_allclose(means[2].numpy(), np.mean(xs, axis=0), rtol=1e-6)
        assert sums[1].device is devs[1]


def test_compiled_step_replays_with_the_collective(devs):
    g = C.Group(devs)
    ws = [d.tensor(np.ones(4, np.float32), requires_grad=True) for d in devs]

    @br.compile
    def grad_mean(w, x):
        (w * x).sum().backward()
        return C.all_reduce(w.grad, g, "mean")

    for it in range(4):
        outs = []
        for k, (d, w) in enumerate(zip(devs, ws)):
            w.grad = None
            outs.append(grad_mean(w, d.tensor(np.full(4, float(k + it), np.float32))))
        C.sync(devs)
        for o in outs:
            np.testing.assert_array_equal(o.numpy(), np.full(4, 1.0 + it, np.float32))
    assert devs[0].stats()["graphs_registered"] <= 2  # captured once, then replayed


def test_gradient_of_all_reduce_is_the_all_reduce_of_gradients(devs):
    g = C.Group(devs)
    xs = [d.tensor(np.full(3, k + 1.0, np.float32), requires_grad=True) for k, d in enumerate(devs)]
    for k, x in enumerate(xs):
        y = C.all_reduce(x, g, "sum")
        (y * float(k + 1)).sum().backward()  # rank k weights the result by k + 1
    C.sync(devs)
    for x in xs:  # d/dx_j sum_k (k+1) * sum_i x_i = 1 + 2 + 3
        np.testing.assert_array_equal(x.grad.numpy(), np.full(3, 6.0, np.float32))


def test_a_late_rank_fails_every_waiting_rank_with_its_name(devs):
    g = C.Group(devs[:2], timeout=0.5)
    a = C.all_reduce(devs[0].tensor(np.ones(2, np.float32)), g)
    with pytest.raises(C.GroupError, match="rank 1 .local:1.") as info:
        a.numpy()
    assert info.value.rank == 1 and info.value.peer == "local:1" and info.value.group == g.id
    b = C.all_reduce(devs[1].tensor(np.ones(2, np.float32)), g)  # the group stays failed
    with pytest.raises(C.GroupError, match="rank 1"):
        b.numpy()
    g.close()
    g2 = C.Group(devs[:2])  # rebuilt from the same devices: works again
    outs = [C.all_reduce(d.tensor(np.ones(2, np.float32)), g2, "sum") for d in devs[:2]]
    np.testing.assert_array_equal(outs[0].numpy(), [2.0, 2.0])


def test_mismatched_shapes_fail_every_rank(devs):
    g = C.Group(devs)
    outs = [
        C.all_reduce(d.tensor(np.ones(2 + (k == 2), np.float32)), g) for k, d in enumerate(devs)
    ]
    for o in outs:
        with pytest.raises(C.GroupError, match="rank 2"):
            o.numpy()


def test_closing_a_group_releases_a_waiting_rank(devs):
    g = C.Group(devs[:2], timeout=60)
    a = C.all_reduce(devs[0].tensor(np.ones(2, np.float32)), g)
    devs[0].flush()
    time.sleep(0.1)
    g.close()
    with pytest.raises(C.GroupError, match="closed"):
        a.numpy()


def test_refusals_at_record_time(devs):
    g = C.Group(devs[:2])
    with pytest.raises(ValueError, match="not in this group"):
        C.all_reduce(devs[2].tensor(np.ones(2, np.float32)), g)
    with pytest.raises(br.RecordError, match="mean.*floating"):
        C.all_reduce(devs[0].tensor(np.ones(2, np.int64)), g, "mean")
    with pytest.raises(br.RecordError, match="op must be"):
        C.all_reduce(devs[0].tensor(np.ones(2, np.float32)), g, "max")
    with pytest.raises(ValueError, match="listed twice"):
        C.Group([devs[0], devs[0]])
    with pytest.raises(ValueError, match="all local"):
        C.Group([devs[0], br.Device.cpu()])
    g.close()
    with pytest.raises(ValueError, match="closed"):
        C.all_reduce(devs[0].tensor(np.ones(2, np.float32)), g)


def test_onnx_export_refuses_the_collective():
    from burn_remote.onnx import NOT_EXPORTABLE

    assert "collective" in NOT_EXPORTABLE["all_reduce"]
