"""The executor's checkpoints (``engine/preempt``): a server's engine turn gives way only
between plan steps, so the checkpoint must run after every step of a run, on the thread that
runs it, and nowhere when none is installed."""

from __future__ import annotations

import threading

import burn_remote as br
import numpy as np
from burn_remote.engine import preempt


def test_the_checkpoint_runs_after_every_step_and_results_are_unchanged():
    dev = br.Device.cpu()
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 64, 64)).astype(np.float32)
    x, y = dev.tensor(a), dev.tensor(b)
    want = (((x @ y) * 0.5 + x).relu() @ y).numpy()
    calls = []
    with preempt.checkpoints(lambda: calls.append(threading.get_ident())):
        got = (((x @ y) * 0.5 + x).relu() @ y).numpy()
    np.testing.assert_array_equal(got, want)  # a checkpoint changes no bits
    assert len(calls) >= 5  # matmul, mul, add, relu, matmul: one after each
    assert set(calls) == {threading.get_ident()}  # on the running thread only
    assert preempt.current() is None


def test_another_threads_runs_do_not_see_this_threads_checkpoint():
    calls = []
    seen = []
    with preempt.checkpoints(lambda: calls.append(1)):
        t = threading.Thread(target=lambda: seen.append(preempt.current()))
        t.start()
        t.join()
        assert preempt.current() is not None
    assert seen == [None] and preempt.current() is None


def test_checkpoints_nest_and_restore():
    def outer() -> None:
        pass

    def inner() -> None:
        pass

    with preempt.checkpoints(outer):
        with preempt.checkpoints(inner):
            assert preempt.current() is inner
        assert preempt.current() is outer
    assert preempt.current() is None
