"""Laziness, lifetimes and errors: nothing runs before a sync; errors name the user's line."""

from __future__ import annotations

import sys

import burn_remote as br
import numpy as np
import pytest


def current_line() -> int:
    return sys._getframe(1).f_lineno


def test_nothing_runs_until_a_sync():
    dev = br.Device.cpu()
    before = dev.stats()["replays"]
    x = dev.tensor(np.arange(4, dtype=np.float32))
    y = (x * 2).exp()
    assert dev.stats()["replays"] == before
    assert len(dev._rec.pending) == 3
    np.testing.assert_allclose(y.numpy(), np.exp(np.arange(4) * 2), rtol=1e-6)
    assert dev.stats()["replays"] == before + 1 and not dev._rec.pending


def test_pending_list_is_bounded(monkeypatch):
    from burn_remote import _recorder

    monkeypatch.setattr(_recorder, "MAX_PENDING_OPS", 50)
    dev = br.Device.cpu()
    x = dev.tensor(np.zeros(2, np.float32))
    for _ in range(200):
        x = x + 1.0
    assert len(dev._rec.pending) <= 50
    assert x.numpy().tolist() == [200.0, 200.0]


def test_dead_tensors_are_dropped_from_the_runtime():
    dev = br.Device.cpu()
    store = dev._rec.runtime.store
    x = dev.tensor(np.ones(3, np.float32))
    y = x + 1
    y.numpy()
    ids = {x._id, y._id}
    assert ids <= store.keys()
    del x, y
    dev.sync()
    assert not ids & store.keys()


def test_shape_error_at_record_time_names_shapes_and_line():
    dev = br.Device.cpu()
    a, b = dev.tensor(np.ones((2, 3), np.float32)), dev.tensor(np.ones((4, 5), np.float32))
    with pytest.raises(br.RecordError) as info:
        line = current_line() + 1
        a @ b
    msg = str(info.value)
    assert "(2, 3)" in msg and "(4, 5)" in msg
    assert f"{__file__}:{line}" in msg


def test_broadcast_error_names_both_shapes():
    dev = br.Device.cpu()
    with pytest.raises(br.RecordError, match=r"\(2, 3\).*\(4,\)"):
        dev.tensor(np.ones((2, 3), np.float32)) + dev.tensor(np.ones(4, np.float32))


def test_execution_error_names_op_and_line_and_device_goes_on():
    dev = br.Device.cpu()
    x = dev.tensor(np.arange(3, dtype=np.float32))
    bad = dev.tensor(np.array([0, 7]))  # out of range: only the kernel can tell
    line = current_line() + 1
    y = x[bad]
    with pytest.raises(br.OpFailed) as info:
        y.numpy()
    assert "index_select" in str(info.value) and f"{__file__}:{line}" in str(info.value)
    with pytest.raises(br.OpFailed):  # a tensor that depends on the failed op fails too
        (y + 1).numpy()
    assert (x + 1).numpy().tolist() == [1.0, 2.0, 3.0]  # the device goes on


def test_cross_device_operands_are_refused():
    class Other(br.Device):
        pass

    from burn_remote._device import LocalRuntime

    other = Other("cpu-other", LocalRuntime("cpu"))
    a = br.Device.cpu().tensor(np.ones(2, np.float32))
    b = other.tensor(np.ones(2, np.float32))
    with pytest.raises(br.RecordError, match="different devices"):
        a + b
    assert (a + b.to(br.Device.cpu())).numpy().tolist() == [2.0, 2.0]


def test_backward_through_a_step_lands_in_one_graph():
    dev = br.Device.cpu()
    w = dev.tensor(np.ones((3, 2), np.float32), requires_grad=True)
    x = dev.tensor(np.ones((4, 3), np.float32))
    loss = (x @ w).sum()
    loss.backward()
    assert w.grad is not None
    cap = dev._rec.capture()
    ops = [n.op for n in cap.nodes]
    assert "matmul" in ops and ops.count("matmul") == 2  # forward and the weight gradient


def test_creation_op_without_a_device_says_so():
    from burn_remote import functional as F

    with pytest.raises(br.RecordError, match="needs a device"):
        F.full(shape=(2,), value=1.0, dtype="float32")


def test_reflected_floor_division():
    dev = br.Device.cpu()
    assert (7 // dev.tensor(np.array([2, 3]))).numpy().tolist() == [3, 2]
    assert (7.0 // dev.tensor(np.array([2.0, 4.0], np.float32))).numpy().tolist() == [3.0, 1.0]
