"""Client protocol and server session wired in memory: no sockets, real frames."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from burn_remote import Device, OpFailed
from burn_remote import functional as F
from burn_remote.protocol import messages as m
from burn_remote.server._loopback import loopback_device
from burn_remote.server._session import Session
from burn_remote.server._state import Limits, ServerState

from .mlp import train


def test_mlp_bitwise_equal_and_one_small_message_per_step() -> None:
    dev, _ = loopback_device()
    seen = []

    def on_step(step: int, data: int) -> None:
        seen.append((dict(dev.stats()), data))

    remote = train(dev, 6, on_step=on_step)
    local = train(Device.cpu(), 6)
    assert remote["losses"] == local["losses"]
    for a, b in zip(remote["weights"], local["weights"]):
        assert a.tobytes() == b.tobytes()
    for (before, _), (after, data) in zip(seen[1:], seen[2:]):
        assert after["messages_sent"] - before["messages_sent"] == 1
        sent = after["bytes_sent"] - before["bytes_sent"]
        assert sent - data <= 1024, sent - data
        assert after["replays"] - before["replays"] == 1
    assert dev.stats()["graphs_registered"] <= 4


def test_error_names_op_and_line_and_session_goes_on() -> None:
    dev, _ = loopback_device()
    a = dev.tensor(np.arange(4, dtype=np.int64))
    idx = dev.tensor(np.array([7], dtype=np.int64))
    bad = F.index_select(a, idx)  # out of range: only the kernel can tell
    line = sys._getframe().f_lineno - 1
    with pytest.raises(OpFailed, match=rf"index_select \(recorded at .*test_session.py:{line}\)"):
        bad.numpy()
    assert (a + 1).sum().item() == 10


def test_unknown_graph_after_eviction_is_replayed_transparently() -> None:
    state = ServerState("cpu", Limits(plan_cache=1))
    dev, _ = loopback_device(state)
    other, _ = loopback_device(state)
    x = dev.tensor(np.ones(3, np.float32))
    assert (x * 2).sum().item() == 6.0
    y = other.tensor(np.ones(2, np.float32))
    assert (y - 1).sum().item() == 0.0  # evicts dev's graph
    assert (x * 2).sum().item() == 6.0  # same digest: ExecuteGraph only, then replay
    assert dev.stats()["reregistrations"] == 1


def test_limits_give_errors_and_memory_is_freed() -> None:
    # room for small tensors and the plans of the small graphs below (PLAN_BYTES_PER_NODE)
    state = ServerState("cpu", Limits(session_memory=16 * 1024))
    dev, session = loopback_device(state)
    dev.tensor(np.ones(100, np.float32)).sum().item()
    big = dev.tensor(np.ones(5000, np.float32))
    with pytest.raises(OpFailed, match="quota"):
        big.sum().item()
    assert dev.tensor(np.ones(2, np.float32)).sum().item() == 2.0
    assert state.bytes > 0
    session.close()
    assert state.bytes == 0 and state.tensors == 0 and not state.sessions
    assert state.held == 0  # the plans' charges left with the last session that used them


def test_tensors_above_the_bulk_threshold_move_both_ways_in_memory() -> None:
    # they ride as bulk transfers: charged to the quota, written into their destination
    state = ServerState("cpu")
    dev, session = loopback_device(state)
    size = state.limits.bulk_threshold // 4 + 1000  # float32 elements: over the threshold
    x = np.random.default_rng(0).standard_normal(size).astype(np.float32)
    t = dev.tensor(x)
    np.testing.assert_array_equal((t * 2).numpy(), x * 2)
    session.close()
    assert state.bytes == 0 and state.held == 0


def test_a_bulk_transfer_over_the_quota_fails_its_upload_and_keeps_the_session() -> None:
    state = ServerState("cpu", Limits(session_memory=2 * 1024 * 1024))
    dev, session = loopback_device(state)
    big = dev.tensor(np.ones(1024 * 1024, np.float32))  # 4 MiB, a bulk transfer
    with pytest.raises(OpFailed, match="quota|memory"):
        big.sum().item()
    assert dev.tensor(np.ones(3, np.float32)).sum().item() == 3.0
    session.close()
    assert state.bytes == 0


def test_tensor_and_graph_count_limits_are_clear_and_all_or_nothing() -> None:
    state = ServerState("cpu", Limits(max_tensors=3, max_graphs=3))
    dev, session = loopback_device(state)
    a = dev.tensor(np.ones(2, np.float32))
    b = a + 1
    assert b.sum().item() == 4.0  # a, b and the sum: 3 tensors
    with pytest.raises(OpFailed, match="max_tensors 3"):
        (a * b).numpy()
    assert len(session.store) == state.tensors <= 3  # the refused output was not stored
    del b
    np.testing.assert_array_equal((a * 3).numpy(), [3, 3])  # room again: the session goes on
    for _ in range(2):  # the refused graph stays refused, without a re-registration loop
        with pytest.raises(OpFailed, match="max_graphs 3"):
            (a - 5).exp().numpy()
    np.testing.assert_array_equal((a * 3).numpy(), [3, 3])  # a graph it has: replayed
    assert session.nbytes == state.bytes == sum(t.nbytes for t in session.store.values())


def test_malformed_frames_get_errors() -> None:
    state = ServerState("cpu")
    s = Session(state)
    s.feed_control(m.encode(m.Hello(m.PROTOCOL_VERSION, b"")))
    assert isinstance(m.decode(s.step(0.0)[0])[0], m.Welcome)
    for frame in [b"", b"\xc1", m.encode(m.Sync(1))[:-1], b"\x91\x92\x63\x00"]:
        s.feed_control(frame)
        (reply,) = s.step(0.0)
        (err,) = m.decode(reply)
        assert isinstance(err, m.Error) and err.code == m.MALFORMED
    s.feed_control(m.encode(m.Sync(5)))
    assert m.decode(s.step(0.0)[0]) == [m.Ack(5)]


def test_targets_and_address_book(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from burn_remote._remote import lookup_address, parse_target
    from burn_remote.protocol.transport import Identity

    assert parse_target("abc@127.0.0.1:4433") == ("abc", ("127.0.0.1", 4433))
    assert parse_target("abc@[::1]:5") == ("abc", ("::1", 5))
    assert parse_target("abc") == ("abc", None)
    with pytest.raises(ValueError, match="brackets"):
        parse_target("abc@::1:5")
    a, b = str(Identity.generate().peer_id), str(Identity.generate().peer_id)
    book = tmp_path / "addresses.toml"
    book.write_text(
        f'[[peer]]\nid = "{a}"\nname = "gpu"\naddresses = ["10.0.0.1:7000", "10.0.0.2:7000"]\n'
        f'[[peer]]\nid = "{b}"\naddresses = ["[fd00::1]:1"]\n'
    )
    assert lookup_address(a, book) == (a, ("10.0.0.1", 7000))
    assert lookup_address("gpu", book) == (a, ("10.0.0.1", 7000))  # by name
    assert lookup_address(b, book) == (b, ("fd00::1", 1))
    with pytest.raises(ValueError, match="not in the address book"):
        lookup_address(str(Identity.generate().peer_id), book)
    book.write_text(f'[peers]\n"{a}" = "10.0.0.1:7000"\n')  # the old, undocumented form
    with pytest.raises(
        ValueError, match=r"'peers' is not part of its format: write each peer as \[\[peer\]\]"
    ):
        lookup_address(a, book)
