"""br.compile through a real `burn-remote serve`: the same bits as the plain step, one small
message per replay, steps batched into shared packets, bounded run-ahead, and a failure on
the server surfacing at the next read with the user's line."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import burn_remote as br
import numpy as np
import pytest
from burn_remote import RemoteDevice
from burn_remote._remote import MAX_STEPS_AHEAD, STEPS_PER_PACKET
from capture_models import MODELS, train


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


_FLAT_MEMORY_SCRIPT = """
import gc, json, sys, tracemalloc
import burn_remote as br
import numpy as np
from burn_remote import RemoteDevice, functional as F, nn, optim

dev = RemoteDevice(sys.argv[1])
nn.seed(0)
net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).to(dev)
opt = optim.AdamW(net.parameters(), lr=1e-3)
x = dev.tensor(np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32))
y = dev.tensor(np.arange(8) % 3)

@br.compile
def step(x, y):
    loss = F.cross_entropy(net(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss

def run(n):
    for i in range(n):
        loss = step(x, y)
        if i % 100 == 99:
            assert np.isfinite(loss.item())

run(500)
gc.collect()
tracemalloc.start()
run(500)
gc.collect()
base, _ = tracemalloc.get_traced_memory()
run(10_000)
gc.collect()
now, _ = tracemalloc.get_traced_memory()
tracemalloc.stop()
proto = dev._rt.proto
print(json.dumps({"grew": now - base, "journal": len(proto.journal),
                  "in_flight": len(proto.in_flight), "results": len(proto.results),
                  "replays": step.stats()["replays"]}))
dev.close()
"""


@pytest.mark.slow
def test_ten_thousand_remote_replays_keep_client_memory_flat(server) -> None:
    """In a client process of its own: tracemalloc counts every thread of the process."""
    out = subprocess.run(
        [sys.executable, "-c", _FLAT_MEMORY_SCRIPT, server.target],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["grew"] < 256 * 1024, seen
    assert seen["journal"] < 1000 and seen["in_flight"] < 200 and seen["results"] < 10, seen
    assert seen["replays"] >= 10_990, seen
