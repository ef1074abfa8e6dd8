"""The local replicas' rendezvous judges lateness by progress, not by the clock alone.

A rank still being recorded by the client, or whose worker is still computing the graph
that leads to the all-reduce, is alive: it is waited for however long that takes (the
GPT-2-small-sized test used to fail under load with "rank 1 did not reach all_reduce #0
within 120 s" while rank 1 was still being recorded and run). A rank that makes no progress
(its worker frozen, or waiting at a rendezvous of its own) is named after the timeout.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from burn_remote import DataParallel, Device, collective
from support.dp_models import assert_state_close, mlp, train_one

TIMEOUT = 0.5
"""The groups' timeout here: the busy phases below last three times longer."""
BUSY_S = 1.5


def _burn_cpu(seconds: float) -> None:
    """Work (CPU used by the calling thread) for `seconds` of wall time."""
    a = np.random.default_rng(0).standard_normal((64, 64))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        a = np.tanh(a @ a)


def _all_reduce_on_both(devices, group):
    xs = [d.tensor(np.full(4, float(k + 1), np.float32)) for k, d in enumerate(devices)]
    return [collective.all_reduce(x, group, "sum") for x in xs]


def test_a_rank_whose_worker_is_still_computing_is_waited_for():
    devices = collective.local_devices(2)
    with collective.Group(devices, timeout=TIMEOUT) as group:
        devices[1]._rec.runtime._put(lambda: _burn_cpu(BUSY_S))  # rank 1's earlier work
        outs = _all_reduce_on_both(devices, group)
        collective.sync(devices)
        for out in outs:
            np.testing.assert_array_equal(out.numpy(), np.full(4, 3.0, np.float32))


def test_a_rank_the_client_is_still_recording_is_waited_for():
    """Rank 0's step is sent; recording rank 1's step takes the client several timeouts."""
    devices = collective.local_devices(2)
    with collective.Group(devices, timeout=TIMEOUT) as group:
        x0 = devices[0].tensor(np.ones(4, np.float32))
        out0 = collective.all_reduce(x0, group, "sum")
        devices[0].flush()  # rank 0's worker now waits at all_reduce #0
        with devices[1].acting():
            _burn_cpu(BUSY_S)  # e.g. recording and capturing a large model's step
            x1 = devices[1].tensor(np.full(4, 2.0, np.float32))
            out1 = collective.all_reduce(x1, group, "sum")
        collective.sync(devices)
        np.testing.assert_array_equal(out0.numpy(), np.full(4, 3.0, np.float32))
        np.testing.assert_array_equal(out1.numpy(), np.full(4, 3.0, np.float32))


def test_a_dataparallel_step_slow_to_record_on_one_replica_is_not_a_late_rank():
    """The first (recorded) step of rank 1 takes several group timeouts to record; the
    training still equals one device on the whole batch."""
    want, _ = train_one(Device.cpu(), mlp, 12, 3)
    model, opt, step, batches = mlp(12, 3)

    def slow_on_rank_1(m, o, x, y):
        if m is not model:
            _burn_cpu(BUSY_S)
        return step(m, o, x, y)

    dp = DataParallel(model, opt, devices=collective.local_devices(2), group_timeout=TIMEOUT)
    run = dp.compile(slow_on_rank_1)
    for x, y in batches:
        run(x, y)
    dp.check_in_sync()
    assert_state_close(dp.state_dict(), want)
    dp.close()


def test_a_frozen_rank_is_still_named_after_the_timeout():
    devices = collective.local_devices(2)
    thaw = threading.Event()
    with collective.Group(devices, timeout=TIMEOUT) as group:
        devices[1]._rec.runtime._put(lambda: thaw.wait(60))  # alive, but makes no progress
        try:
            out0, _ = _all_reduce_on_both(devices, group)
            with pytest.raises(collective.GroupError) as info:  # the timeout: the frozen
                devices[0].sync()  # job itself would hold rank 1 for 60 s
            assert info.value.rank == 1 and "local:1" in str(info.value)
            assert "no progress" in str(info.value)
        finally:
            thaw.set()


def test_two_ranks_waiting_for_each_other_fail_rather_than_wait_forever():
    """Rank 0 calls group A's all-reduce first, rank 1 group B's: each waits for the other,
    and waiting is not progress, so the groups fail."""
    devices = collective.local_devices(2)
    a = collective.Group(devices, timeout=TIMEOUT)
    b = collective.Group(devices, timeout=TIMEOUT)
    x = [d.tensor(np.ones(2, np.float32)) for d in devices]
    collective.all_reduce(x[0], a, "sum")
    collective.all_reduce(x[0], b, "sum")
    collective.all_reduce(x[1], b, "sum")
    collective.all_reduce(x[1], a, "sum")
    for d in devices:
        d.flush()
    for d in devices:
        with pytest.raises(collective.GroupError, match="no progress"):
            d.sync()
    a.close()
    b.close()


def _out_of_memory() -> None:
    raise MemoryError("Unable to allocate 2.00 GiB for an array")


def test_a_rank_whose_step_failed_before_the_all_reduce_is_named_at_once_with_its_error():
    """Rank 1's graph fails before its all-reduce (here: memory runs out) and it has nothing
    else to run: it will never come, so rank 0 fails at once (not after the 60 s timeout)
    with rank 1's own error in the message, and rank 1's client sees that error."""
    devices = collective.local_devices(2)
    runtime = devices[1]._rec.runtime
    runtime.execute = lambda capture: runtime._put(_out_of_memory)  # its graph fails midway
    with collective.Group(devices, timeout=60) as group:
        outs = _all_reduce_on_both(devices, group)
        devices[0].flush()
        with pytest.raises(MemoryError):  # the client hears of it first (as DataParallel's
            devices[1].sync()  # wait does) -- rank 0 must still not wait for rank 1
        with pytest.raises(collective.GroupError) as info:
            outs[0].numpy()
        assert "no progress" not in str(info.value)  # not the 60 s timeout's error
        assert info.value.rank == 1 and "local:1" in str(info.value)
        assert "its work failed before it (MemoryError: Unable to allocate" in str(info.value)


def test_a_failed_job_does_not_stop_a_rank_that_still_has_the_collective_to_run():
    """The failure is kept for rank 1's next wait; the graph queued after it still runs and
    reaches the all-reduce, which completes."""
    devices = collective.local_devices(2)
    with collective.Group(devices, timeout=60) as group:
        devices[1]._rec.runtime._put(_out_of_memory)
        outs = _all_reduce_on_both(devices, group)
        devices[1].flush()
        np.testing.assert_array_equal(outs[0].numpy(), np.full(4, 3.0, np.float32))
        with pytest.raises(MemoryError):
            devices[1].sync()
