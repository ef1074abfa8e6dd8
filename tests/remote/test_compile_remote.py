"""br.compile through a real `burn-remote serve`: the same bits as the plain step, one small
message per replay, steps batched into shared packets, bounded run-ahead, and a failure on
the server surfacing at the next read with the user's line."""

from __future__ import annotations

import threading

import burn_remote as br
import numpy as np
import pytest
from burn_remote import RemoteDevice
from burn_remote._remote import MAX_STEPS_AHEAD, STEPS_PER_PACKET
from support import replay_memory
from support.capture_models import MODELS, train


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_captured_training_on_a_server_equals_plain_training_bitwise(server, kind) -> None:
    dev = RemoteDevice(server.target)
    plain = train(dev, MODELS[kind], 100, compiled=False)
    sent_before = dev.stats()["messages_sent"]
    captured = train(dev, MODELS[kind], 100, compiled=True)
    assert captured["__stats__"]["replays"] >= 95
    for name in plain:
        assert np.array_equal(plain[name], captured[name]), name
    local = train(br.Device.cpu(), MODELS[kind], 100, compiled=True)
    for name in plain:
        assert np.array_equal(local[name], captured[name]), name
    # uploads go in the steps' batches: far fewer packets than steps once replaying
    assert dev.stats()["messages_sent"] - sent_before < 100, dev.stats()
    dev.close()


def test_replays_share_packets_run_ahead_boundedly_and_report_errors_late(server) -> None:
    dev = RemoteDevice(server.target)
    table = dev.tensor(np.arange(10, dtype=np.float32))

    @br.compile
    def pick(idx):
        return (table[idx] * 2).sum()

    good = dev.tensor(np.array([1, 2, 3]))
    for _ in range(3):
        assert pick(good).item() == 12.0
    rt = dev._rt
    before = dev.stats()["messages_sent"]
    for _ in range(200):
        out = pick(good)
        ahead = rt._steps - rt._acked
        assert ahead <= MAX_STEPS_AHEAD + STEPS_PER_PACKET
        assert len(rt.proto.in_flight) <= MAX_STEPS_AHEAD + 2 * STEPS_PER_PACKET
    assert out.item() == 12.0
    assert dev.stats()["messages_sent"] - before <= 200 // 2
    assert pick.stats()["replays"] == 201
    bad = dev.tensor(np.array([1, 99, 3]))  # out of range: only the server can tell
    out = pick(bad)  # returns at once: the failure is not known yet
    with pytest.raises(br.OpFailed, match=r"recorded at .*test_compile_remote.py:\d+"):
        out.item()
    assert pick(good).item() == 12.0  # the session goes on
    dev.close()


def test_a_read_after_compiled_steps_is_read_by_the_thread_that_waits(server) -> None:
    """The read after a few queued steps is the last request sent: every reply before it
    comes first and none is owed after it, so the waiting thread reads it off the socket
    itself (no hand-off from the connection's reader thread)."""
    from burn_remote import _remote_link

    dev = RemoteDevice(server.target)
    table = dev.tensor(np.arange(10, dtype=np.float32))

    @br.compile
    def pick(idx):
        return (table[idx] * 2).sum()

    good = dev.tensor(np.array([1, 2, 3]))
    assert pick(good).item() == 12.0
    handled: list[bool] = []
    on_control = _remote_link.Link._on_control
    me = threading.get_ident()

    def spy(self, frame):  # type: ignore[no-untyped-def]
        handled.append(threading.get_ident() == me)
        return on_control(self, frame)

    _remote_link.Link._on_control = spy
    try:
        in_thread = 0
        for _ in range(8):
            for _ in range(3):
                out = pick(good)
            handled.clear()
            assert out.item() == 12.0
            in_thread += handled[-1]
    finally:
        _remote_link.Link._on_control = on_control
    assert dev._rt._steps > 20 and in_thread >= 6, in_thread
    dev.close()


@pytest.mark.slow
def test_ten_thousand_remote_replays_keep_client_memory_flat(server) -> None:
    """The client's memory, its journal and requests in flight stay flat (measured in a
    client process of its own)."""
    seen = replay_memory.measure(server.target)
    assert seen["grew"] < 256 * 1024, seen
    assert seen["journal"] < 1000 and seen["in_flight"] < 200 and seen["results"] < 10, seen
    assert seen["replays"] >= 10_990, seen
