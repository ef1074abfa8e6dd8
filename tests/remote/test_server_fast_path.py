"""The server's per-message fast paths (issues 15 and 16): a lone Read answered without the
message machinery, one plan-cache lookup and few ledger updates per replayed step, and the
per-peer memory cap reused for a short, named interval. Each gives what the general path
gives; the tests compare them and count the work."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from burn_remote import functional as F
from burn_remote.protocol import messages as m
from burn_remote.protocol.transport import AuthorizedPeers, Identity
from burn_remote.server import _state
from burn_remote.server._loopback import loopback_device
from burn_remote.server._replies import Place
from burn_remote.server._session import Session
from burn_remote.server._state import PEER_CAP_RECHECK, PEER_MEMORY_SHARE, Limits, ServerState


def _greeted(state: ServerState, peer: str = "peer") -> Session:
    s = Session(state, peer)
    s.feed_control(m.encode(m.Hello(m.PROTOCOL_VERSION, b"", {})))
    (welcome,) = m.decode(s.step(0.0)[0])
    assert isinstance(welcome, m.Welcome)
    return s


def _by_messages(s: Session, frame: bytes, now: float) -> bytes:
    s.feed_control(frame)
    (reply,) = s.step(now, Place.LOOP)
    return reply


def test_a_lone_read_is_answered_as_the_message_path_answers_it() -> None:
    state = ServerState("cpu")
    fast, slow = _greeted(state), _greeted(state)
    for value in (np.float32(2.5).reshape(()), np.arange(6, dtype=np.int64).reshape(2, 3)):
        for s in (fast, slow):
            s.put(7, value)
        frame = m.encode(m.Read(2**40, 7))
        reply = fast.answer_alone(frame, 5.0)
        assert reply is not None
        assert reply == _by_messages(slow, frame, 5.0)
        (data,) = m.decode(reply)
        assert (data.request_id, data.data, data.bulk_id) == (2**40, value.tobytes(), 0)
    assert (fast.messages, fast.traffic, fast.last_active) == (
        slow.messages,
        slow.traffic,
        slow.last_active,
    )


@pytest.mark.parametrize(
    "case",
    ["missing", "large", "with a drop", "bool id", "negative id", "stalled", "not greeted",
     "queued", "truncated"],
)  # fmt: skip
def test_what_the_lone_read_path_leaves_to_the_message_path(case: str) -> None:
    """Everything but a plain Read of a small tensor is left (None) to the message path,
    which answers it as before (an error, a transfer, in order)."""
    state = ServerState("cpu", Limits(max_frame=4096))  # bulk threshold 1024 bytes
    s = _greeted(state) if case != "not greeted" else Session(state, "peer")
    s.put(1, np.ones(4, np.float32))
    s.put(2, np.ones(1024, np.float32))
    frame = {
        "missing": m.encode(m.Read(3, 99)),
        "large": m.encode(m.Read(3, 2)),
        "with a drop": m.encode([m.Read(3, 1), m.Drop((2,))]),
        "bool id": msgpack.packb([[m.Read.TAG, True, 1]]),
        "negative id": msgpack.packb([[m.Read.TAG, 3, -1]]),
        "truncated": m.encode(m.Read(3, 2**40))[:-2],
    }.get(case, m.encode(m.Read(3, 1)))
    if case == "stalled":
        s.stalled = True
    if case == "queued":
        s.feed_control(m.encode(m.Sync(2)))
    before = (s.messages, list(s.traffic))
    assert s.answer_alone(frame, 1.0) is None
    assert (s.messages, s.traffic) == before
    if case == "missing":
        (err,) = m.decode(_by_messages(s, frame, 1.0))
        assert err.code == m.MISSING_TENSOR and err.request_id == 3


def _replay_frame(dev: Any, session: Session) -> bytes:
    """A replayed step's frame: one ExecuteGraph of a cached plan that writes its state in
    place (output id = input id, as a captured step does), runnable again and again."""
    w = dev.tensor(np.ones((4, 4), np.float32))
    x = dev.tensor(np.full((2, 4), 0.5, np.float32))
    for _ in range(2):
        w._assign(w - 0.1 * F.relu(x @ w).sum() * w)
        dev.sync()
    msgs = [msg for frame in dev._rt.link.frames for msg in m.decode(frame)]
    last = [msg for msg in msgs if type(msg) is m.ExecuteGraph][-1]
    (out,) = last.output_ids
    state_in = [tid for tid in last.input_ids if tid in last.drops]
    ids = tuple(out if tid in state_in else tid for tid in last.input_ids)
    frame = m.encode(m.ExecuteGraph(99, last.digest, ids, last.values, (out,), ()))
    for _ in range(2):  # it runs, and again
        session.feed_control(frame)
        assert session.step(1.0) == []
    return frame


class _CountingLock:
    """The ledger's lock, counting acquisitions."""

    def __init__(self) -> None:
        self.lock, self.count = threading.Lock(), 0

    def __enter__(self) -> None:
        self.count += 1
        self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def test_a_replayed_step_asks_the_plan_cache_once_and_the_ledger_twice() -> None:
    """Deciding where an ExecuteGraph runs and running it share one plan lookup; the run's
    arena is returned with the outputs' charge (one ledger update, besides the arena's
    reservation before the run); an inline Upload is one ledger update."""
    state = ServerState("cpu")
    dev, session = loopback_device(state)
    frame = _replay_frame(dev, session)
    asked = []
    plan = state.plan
    state.plan = lambda digest: asked.append(digest) or plan(digest)  # type: ignore[method-assign]
    state.lock = _CountingLock()  # type: ignore[assignment]
    held, tensors = state.held, state.tensors
    session.feed_control(frame)
    kinds = [type(msg) for msg in session.queue]
    assert kinds.count(m.ExecuteGraph) == 1 and m.Upload not in kinds
    session.step(1.0, Place.LOOP)
    assert not session.queue and len(asked) == 1
    assert state.lock.count == 3  # the plan lookup, the arena, the outputs with the arena
    assert state.held == held and state.tensors == tensors  # nothing leaked or lost

    state.lock.count = 0
    session.feed_control(m.encode(m.Upload(0, 10**6, "float32", (3,), b"\0" * 12, 0)))
    session.step(2.0, Place.LOOP)
    assert state.lock.count == 1 and state.tensors == tensors + 1


def test_the_arena_goes_back_to_the_ledger_however_a_step_ends() -> None:
    """The arena held for a run is returned with the outputs' charge, and also when that
    charge is refused (max_tensors) or the run is refused before it starts."""
    state = ServerState("cpu", Limits(max_tensors=3))
    dev, session = loopback_device(state)
    frame = _replay_frame(dev, session)
    (run,) = m.decode(frame)
    assert state.plan(run.digest.hex()).peak_bytes > 0
    held = state.held

    def replies(msg: m.ExecuteGraph) -> list[Any]:
        session.feed_control(m.encode(msg))
        return [r for out in session.step(1.0) for r in m.decode(out)]

    new_ids = [dataclasses.replace(run, output_ids=(k,)) for k in (555, 556)]
    assert replies(new_ids[0]) == [] and len(session.store) == 3
    (err,) = replies(new_ids[1])  # a fourth tensor: refused after the run
    assert err.code == m.LIMIT and "max_tensors 3" in err.message
    assert state.held == held and 556 not in session.store

    state.plan(run.digest.hex()).peak_bytes = state.limits.session_memory  # refused first
    (err,) = replies(run)
    assert err.code == m.LIMIT and state.held == held


def test_the_peer_memory_cap_is_reused_for_a_short_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cap a message checks rereads the authorized-peers file at most once per
    PEER_CAP_RECHECK (each reread is a stat); admission still rereads it every time, so
    a peer removed from the file is refused at once."""
    alice, bob = Identity.generate().peer_id, Identity.generate().peer_id
    peers = tmp_path / "authorized_peers"
    peers.write_text(f"{alice}\n{bob}\n")
    state = ServerState("cpu")
    state.authorized = policy = AuthorizedPeers(peers)
    clock = [100.0]
    monkeypatch.setattr(_state, "_monotonic", lambda: clock[0])
    looks = [0]
    admitted = policy.admitted
    monkeypatch.setattr(
        policy, "admitted", lambda: looks.__setitem__(0, looks[0] + 1) or admitted()
    )
    s = _greeted(state, str(alice))
    for k in range(50):
        s.put(k, np.ones(4, np.float32))
    share = int(state.limits.memory_limit * PEER_MEMORY_SHARE)
    assert looks[0] == 1 and state.peer_memory_cap() == share

    peers.write_text(f"{alice}\n")  # bob is gone; alice's server is now hers alone
    assert policy.check(bob) is not None  # refused at once
    assert state.peer_memory_cap() == share and looks[0] == 1  # the cap: until the interval
    clock[0] += PEER_CAP_RECHECK
    s.put(99, np.ones(4, np.float32))
    assert looks[0] == 2 and state.peer_memory_cap() == 0


def test_metrics_count_live_sessions_and_keep_ended_ones() -> None:
    state = ServerState("cpu")
    dev, session = loopback_device(state)
    x = dev.tensor(np.ones(4, np.float32))
    assert (x * 2).sum().item() == 8.0
    live = state.traffic()
    assert live["steps"] >= 1 and live["bytes_received"] >= 16 and live["bytes_sent"] >= 4
    assert live["messages"] == session.messages
    dev.close()  # its last message (the drops) counts too
    ended = state.traffic()
    assert not state.sessions and ended["messages"] == session.messages >= live["messages"]
    assert [ended[k] for k in ("steps", "bytes_received", "bytes_sent")] == [
        live[k] for k in ("steps", "bytes_received", "bytes_sent")
    ]


@pytest.mark.parametrize(
    "value",
    [np.float32(1.5).reshape(1), np.arange(12, dtype=np.int64).reshape(3, 4), np.zeros((0, 2))],
)
def test_a_data_frame_encoded_directly_is_the_message_encoding(value: np.ndarray) -> None:
    """``encode_data_frame`` (the lone Read's reply) writes Data's wire form, field for field."""
    args = (2**64 - 1, str(value.dtype), value.shape, value.tobytes())
    packer = m.packer()
    for data in (args[3], value.data, np.ascontiguousarray(value).data):
        frame = m.encode_data_frame(packer, *args[:3], data)
        assert frame == m.encode(m.Data(*args, 0))
        assert m.decode(frame) == [m.Data(*args, 0)]


def test_a_scalar_reads_back_as_a_scalar() -> None:
    """A 0-d tensor's Data says shape () on both read paths and on a server-to-server move,
    so ``numpy()`` of a remote scalar is 0-d as on the CPU device (it came back as (1,))."""
    dev, session = loopback_device()
    t = dev.tensor(np.ones(4, np.float32)).sum()
    assert t.numpy().shape == () and t.numpy() == 4.0
    assert dev.tensor(np.float32(2.5)).numpy().shape == ()
    state = session.state
    s = _greeted(state)
    s.put(3, np.float32(7.0).reshape(()))
    frame = m.encode(m.Read(1, 3))
    fast = s.answer_alone(frame, 1.0)
    assert fast is not None and m.decode(fast)[0].shape == ()
    assert m.decode(_by_messages(s, frame, 1.0))[0].shape == ()
    token = state.grant("other", s.store[3], s.id)
    reply, _ = state.serve_fetch(m.encode(m.Fetch(0, "x", "", token)), "other")
    (data,) = m.decode(reply)
    assert data.shape == () and data.bulk_id == 1


def test_engine_work_stays_off_the_loop_while_a_heavy_turn_runs() -> None:
    """The loop never runs a step beside a heavy engine turn (its products would wait
    inside OpenBLAS for the turn's, the loop and every session on it stalled): the small
    timed step is left for a worker, which asks in fair order. Beside a light turn (another
    peer's small step on a worker) it runs on the loop as before. A small Upload, a copy,
    runs on the loop either way."""
    from burn_remote.server._fair import HEAVY_TURN

    state = ServerState("cpu")
    dev, session = loopback_device(state)
    frame = _replay_frame(dev, session)
    session.feed_control(frame)
    session.step(1.0, Place.LOOP)  # timed now: it fits the loop's budget
    assert not session.queue

    fair = state.fair
    flood = fair.ask("flood", "session", 1.0)
    fair.finish(flood, 2 * HEAVY_TURN)  # its last turn was heavy
    flood = fair.ask("flood", "session", 1.0)  # and it runs again, on a worker
    assert flood.granted and fair.heavy == 1
    session.feed_control(m.encode(m.Upload(0, 10**6, "float32", (3,), b"\0" * 12, 0)))
    session.feed_control(frame)
    assert session.step(2.0, Place.LOOP) == []
    assert [type(msg) for msg in session.queue] == [m.ExecuteGraph]  # the upload ran
    assert session.next_place() is Place.ENGINE
    fair.finish(flood, HEAVY_TURN / 4)
    assert fair.heavy == 0

    light = fair.ask("flood", "session", 1.0)  # its last turn was light now
    assert light.granted and fair.heavy == 0
    assert session.next_place() is Place.LOOP
    session.step(3.0, Place.LOOP)
    assert not session.queue
    fair.finish(light, 0.0)
    assert fair.busy == 0 and fair.heavy == 0
