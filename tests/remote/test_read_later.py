"""A read asked for now and taken later (`Tensor._numpy_later`, `Recorder.read_later`, what
`generate` reads its tokens with on a remote device): the value the tensor had when asked,
whatever runs in between, through a real server. The Read goes ahead of the steps queued
after it (the server runs messages in order), so a replayed step that writes the tensor in
place, queued after the request, does not change what comes back. A local device, which
computes as work is queued, has no such read (None: the caller reads when it wants)."""

from __future__ import annotations

import burn_remote as br
import numpy as np
from burn_remote import Device, RemoteDevice


def _counter(dev):  # type: ignore[no-untyped-def]
    """A state tensor and a captured step that adds its argument to it in place."""
    state = dev.tensor(np.zeros(3, np.float32))

    @br.compile
    def step(x):  # type: ignore[no-untyped-def]
        state._assign(state + x)
        return state.sum()

    return state, step


def test_a_local_device_reads_when_asked():
    state, _ = _counter(Device.cpu())
    assert state._numpy_later() is None


def test_a_later_read_gets_the_value_asked_for_not_what_later_steps_wrote(server):
    dev = RemoteDevice(server.target)
    state, step = _counter(dev)
    one = dev.tensor(np.ones(3, np.float32))
    for _ in range(3):  # recorded twice, then replayed (in place on the server)
        step(one)
    take = state._numpy_later()
    before = step.stats()["replays"]
    for _ in range(4):
        step(one)
    assert step.stats()["replays"] == before + 4
    np.testing.assert_array_equal(take(), [3, 3, 3])
    np.testing.assert_array_equal(state.numpy(), [7, 7, 7])
    # the tensor read may be dropped before it is taken: the call holds it
    take = (state * 2)._numpy_later()
    step(one)
    np.testing.assert_array_equal(take(), [14, 14, 14])
    dev.close()
