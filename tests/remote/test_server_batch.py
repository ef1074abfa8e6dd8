"""A run of replays of one cached graph charged to the ledger once (``server/_batch.py``,
issue 15): whatever the frames hold, the session ends in the state, with the replies,
counters and ledger the message-by-message path gives; a run asks the plan cache once and
the ledger twice; its reservation counts against the peer's cap while it runs."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import burn_remote as br
import numpy as np
import pytest
from burn_remote.engine import executor as executor_mod
from burn_remote.engine.executor import ExecutionError
from burn_remote.protocol import messages as m
from burn_remote.server import _session
from burn_remote.server._handlers import HANDLERS
from burn_remote.server._loopback import loopback_device
from burn_remote.server._replies import Place
from burn_remote.server._session import Session
from burn_remote.server._state import LimitExceeded, Limits, ServerState
from support.capture_models import mlp

STEPS_PER_READ = 6


def _frames() -> list[bytes]:
    """The control frames of a captured digits-MLP loop (loss read every few steps)."""
    dev, _ = loopback_device()
    _, step, batch = mlp(dev)
    run = br.compile(step)
    for i in range(4 * STEPS_PER_READ):
        loss = run(*batch(i))
        if i % STEPS_PER_READ == STEPS_PER_READ - 1:
            loss.item()
    return list(dev._rt.link.frames)


FRAMES: list[bytes] = []


def frames() -> list[bytes]:
    if not FRAMES:
        FRAMES.extend(_frames())
    return FRAMES


def _no_runs(s: Any, budget: Any) -> tuple[int, float]:
    return 0, 0.0


def _serve(
    all_frames: list[bytes],
    batched: bool,
    monkeypatch: pytest.MonkeyPatch,
    limits: Limits | None = None,
    place: bool = False,
    tweak: Any = None,
) -> dict[str, Any]:
    """Feed the frames to a fresh server's session: its replies and everything it holds."""
    with monkeypatch.context() as mp:
        if not batched:
            mp.setattr(_session, "start_run", _no_runs)
        runs: list[int] = []
        real = _session.start_run

        def counted(s: Any, budget: Any) -> Any:
            out = real(s, budget)
            runs.append(out[0])
            return out

        mp.setattr(_session, "start_run", counted)
        state = ServerState("cpu", limits)
        s = Session(state, "peer")
        if tweak is not None:
            tweak(mp, state)
        replies: list[Any] = []
        for frame in all_frames:
            s.feed_control(frame)
            while s.queue:
                left = len(s.queue)
                outs = s.step(1.0, s.next_place() if place else None)
                replies += [r for out in outs for r in m.decode(out)]
                if len(s.queue) == left:
                    break
        return {
            "replies": replies,
            "store": {k: (v.dtype, v.shape, v.tobytes()) for k, v in s.store.items()},
            "session": (s.nbytes, s.peak, s.messages, list(s.traffic), s.run_reserved),
            "ledger": (state.tensors, state.bytes, state.held, state.peak_bytes),
            "taken": sum(n for n in runs if n > 0),
        }


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert [_plain(r) for r in a["replies"]] == [_plain(r) for r in b["replies"]]
    assert a["store"].keys() == b["store"].keys()
    for k in a["store"]:
        assert a["store"][k] == b["store"][k], k
    assert a["session"] == b["session"]
    assert a["ledger"] == b["ledger"]


@pytest.mark.parametrize("place", [False, True], ids=["worker", "by place"])
def test_runs_of_replays_end_as_the_message_path_ends(monkeypatch, place) -> None:
    fs = frames()
    batched = _serve(fs, True, monkeypatch, place=place)
    plain = _serve(fs, False, monkeypatch, place=place)
    _same(batched, plain)
    assert plain["taken"] == 0
    n_steps = sum(
        1 for f in fs for msg in m.decode(f) if type(msg) is m.ExecuteGraph
    )  # every step of the captured part goes through runs
    assert batched["taken"] >= 2 * (n_steps - 2 * STEPS_PER_READ)
    assert [type(r) for r in batched["replies"]].count(m.Data) == 4


def _plain(reply: Any) -> Any:
    """A reply without what is random per session (a Welcome's resume token)."""
    return reply.session_id if type(reply) is m.Welcome else reply


def _mutate(fs: list[bytes], change: Any) -> list[bytes]:
    """The frames with the 3rd step of the first long replay frame changed by ``change``."""
    out = list(fs)
    for i, f in enumerate(fs):
        msgs = m.decode(f)
        execs = [k for k, msg in enumerate(msgs) if type(msg) is m.ExecuteGraph]
        if len(execs) >= 4:
            change(msgs, execs[2])
            out[i] = m.encode(msgs)
            return out
    raise AssertionError("no replay frame")


def _missing_input(msgs: list[Any], k: int) -> None:
    run = msgs[k]
    msgs[k] = run.__class__(
        run.request_id, run.digest, (10**9, *run.input_ids[1:]), run.values, run.output_ids, ()
    )


def _bad_upload(msgs: list[Any], k: int) -> None:
    up = msgs[k - 1]
    assert type(up) is m.Upload
    msgs[k - 1] = m.Upload(0, up.tensor_id, up.dtype, up.shape, up.data[:-4], 0)


def _wrong_shape(msgs: list[Any], k: int) -> None:
    up = msgs[k - 1]
    msgs[k - 1] = m.Upload(0, up.tensor_id, "int8", (len(up.data),), up.data, 0)


def _drops_with_the_step(msgs: list[Any], k: int) -> None:
    run, up = msgs[k], msgs[k - 1]
    msgs[k] = run.__class__(
        run.request_id, run.digest, run.input_ids, run.values, run.output_ids, (up.tensor_id,)
    )


@pytest.mark.parametrize(
    "change", [_missing_input, _bad_upload, _wrong_shape, _drops_with_the_step]
)
def test_a_bad_message_in_a_run_is_answered_as_alone(monkeypatch, change) -> None:
    fs = _mutate(frames(), change)
    batched = _serve(fs, True, monkeypatch)
    _same(batched, _serve(fs, False, monkeypatch))
    assert batched["taken"]
    if change is not _drops_with_the_step:
        assert any(type(r) is m.Error for r in batched["replies"])


def _fail_third_run(mp: pytest.MonkeyPatch, state: ServerState) -> None:
    calls = [0]
    real = executor_mod.Executor.run

    def run(self: Any, plan: Any, *args: Any) -> Any:
        calls[0] += 1
        if calls[0] == 12:  # a replay, inside a run
            raise ExecutionError("boom", 3, "matmul")
        return real(self, plan, *args)

    mp.setattr(executor_mod.Executor, "run", run)


def _outputs_larger_than_declared(mp: pytest.MonkeyPatch, state: ServerState) -> None:
    real = state.register

    def register(*args: Any, **kwargs: Any) -> Any:
        plan = real(*args, **kwargs)
        plan.output_bytes = 0
        return plan

    mp.setattr(state, "register", register)


@pytest.mark.parametrize(
    "limits, tweak",
    [
        (None, _fail_third_run),
        (None, _outputs_larger_than_declared),
        (Limits(session_memory=250_000), None),
        (Limits(session_memory=280_000), None),
        (Limits(max_tensors=18), None),
        (Limits(max_tensors=20), None),
    ],
    ids=["engine failure", "larger outputs", "quota", "quota edge", "tensors", "tensors later"],
)
def test_failures_and_limits_inside_a_run_end_as_the_message_path_ends(
    monkeypatch, limits, tweak
) -> None:
    fs = frames()
    batched = _serve(fs, True, monkeypatch, limits, tweak=tweak)
    _same(batched, _serve(fs, False, monkeypatch, limits, tweak=tweak))
    errors = [r for r in batched["replies"] if type(r) is m.Error]
    if tweak is _fail_third_run:  # then its state is gone: later steps miss it
        assert errors[0].code == m.EXECUTION and errors[0].node == 3
        assert errors[0].request_id and {e.code for e in errors[1:]} == {m.MISSING_TENSOR}
    if limits is not None and limits.session_memory != 280_000:
        assert errors[0].code == m.LIMIT


class _CountingLock:
    def __init__(self) -> None:
        self.lock, self.count = threading.Lock(), 0

    def __enter__(self) -> None:
        self.count += 1
        self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def test_a_run_asks_the_plan_cache_once_and_the_ledger_twice() -> None:
    """Message by message a step of two uploads and a replay takes the ledger's lock four
    times (and the plan's once); a run of them takes it three times in all."""
    fs = frames()
    state = ServerState("cpu")
    s = Session(state, "peer")
    frame = None
    for f in fs:
        msgs = m.decode(f)
        kinds = [type(msg) for msg in msgs]
        if kinds.count(m.ExecuteGraph) == STEPS_PER_READ and frame is None and s.store:
            frame = f
            break
        s.feed_control(f)
        s.step(1.0)
    assert frame is not None
    asked: list[str] = []
    plan = state.plan
    state.plan = lambda digest: asked.append(digest) or plan(digest)  # type: ignore[method-assign]
    state.lock = _CountingLock()  # type: ignore[assignment]
    s.feed_control(frame)
    head = [type(msg) for msg in s.queue][: 3 * STEPS_PER_READ]
    assert head == [m.Upload, m.Upload, m.ExecuteGraph] * STEPS_PER_READ
    s.step(2.0, Place.ENGINE)
    assert len(asked) == 1
    # the plan, the reservation, the settlement; then the Read and Drop at the frame's end
    assert state.lock.count <= 3 + 1
    assert s.run_reserved == 0 and not s.queue


def test_the_loop_takes_as_many_steps_as_its_budget(monkeypatch) -> None:
    """On the network loop a run stops before the step that would pass the loop's budget
    (its uploads in); the rest goes the usual way (a worker), and the queue always moves."""
    fs = frames()
    state = ServerState("cpu")
    s = Session(state, "peer")
    for f in fs[:-1]:
        s.feed_control(f)
        while s.queue:
            s.step(1.0)
    frame = fs[-1]  # six replayed steps, a Read, a Drop
    digest = next(x for x in m.decode(frame) if type(x) is m.ExecuteGraph).digest
    plan = state.plan(digest.hex())
    plan.seconds = _session.INLINE_BUDGET / 2.5  # two steps fit
    s.feed_control(frame)
    before = len(s.queue)
    s.step(3.0, Place.LOOP)
    kinds = [type(x) for x in s.queue]
    assert before - len(s.queue) == 8  # two steps and the third's two uploads
    assert kinds[0] is m.ExecuteGraph
    plan.seconds = None  # not timed: nothing of it on the loop
    s.step(3.0, Place.LOOP)
    assert len(s.queue) == len(kinds)
    assert s.next_place() is Place.ENGINE
    rounds = 0
    while s.queue:  # as the daemon drives it: always moving
        plan.seconds = _session.INLINE_BUDGET * 0.9
        s.step(4.0, s.next_place())
        rounds += 1
        assert rounds < 100


def test_a_runs_reservation_counts_against_the_peers_cap() -> None:
    """While a run holds its reservation, the peer's other sessions (and this one's bulk
    transfers) count it as held: together they cannot pass the cap."""
    state = ServerState("cpu", Limits(peer_memory=1000))
    a, b = Session(state, "peer"), Session(state, "peer")
    state.sessions.update({1: a, 2: b})
    state.reserve_run(a, 800)
    with pytest.raises(LimitExceeded, match="peer"):
        b.reserve(300)
    with pytest.raises(LimitExceeded):
        a.reserve(300)
    state.settle_run(800, 0, 0)
    a.run_reserved = 0
    b.reserve(300)
    assert state.held == 300


@pytest.mark.parametrize("buffer", [bytes, bytearray, memoryview])
def test_inline_upload_bytes_become_the_tensor_without_a_copy(buffer) -> None:
    """The decoded message's own bytes are immutable: the tensor reads them where they are
    (read-only); a buffer that may change or belong to something larger is copied."""
    state = ServerState("cpu")
    s = Session(state, "peer")
    raw = np.arange(6, dtype=np.float32).tobytes()
    data = buffer(raw)
    a = s.array("float32", (2, 3), data)
    assert np.array_equal(a, np.arange(6, dtype=np.float32).reshape(2, 3))
    shared = np.shares_memory(a, np.frombuffer(data, np.uint8))
    assert shared == (buffer is bytes)
    if buffer is bytes:
        assert not a.flags.writeable
    scalar = s.array("int64", (), np.int64(7).tobytes())
    assert scalar.shape == () and scalar == 7
    with pytest.raises(Exception, match="needs 24 bytes"):
        s.array("float32", (2, 3), raw[:-4])


def test_every_message_of_a_run_goes_through_the_handler_table(monkeypatch) -> None:
    """A run changes where its charges go, not how its messages run: each Upload and
    ExecuteGraph of a run is answered by its entry in the handler table (issue 35: one
    execution path)."""
    calls: dict[type, int] = {m.Upload: 0, m.ExecuteGraph: 0}
    for kind in calls:
        entry = HANDLERS[kind]

        def counted(s: Any, msg: Any, now: float, run: Any = entry.run, kind: type = kind) -> Any:
            calls[kind] += 1
            return run(s, msg, now)

        monkeypatch.setitem(HANDLERS, kind, dataclasses.replace(entry, run=counted))
    fs = frames()
    served = _serve(fs, True, monkeypatch)
    sent = [type(msg) for f in fs for msg in m.decode(f)]
    assert served["taken"] > 0
    assert calls == {m.Upload: sent.count(m.Upload), m.ExecuteGraph: sent.count(m.ExecuteGraph)}
