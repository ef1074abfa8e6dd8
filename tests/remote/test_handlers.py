"""The server's handler table: one entry per client message, nothing placed on the network
loop that waits, and a session's reads unaffected by another session's job polling."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from burn_remote import RemoteDevice
from burn_remote.protocol import messages as m
from burn_remote.server import _session
from burn_remote.server._handlers import HANDLERS
from burn_remote.server._loopback import loopback_device
from burn_remote.server._replies import Place
from burn_remote.server._state import ServerState
from burn_remote.server.jobs import JobService

from tests.jobs.models import failing_spec


def test_every_client_message_has_exactly_one_handler() -> None:
    assert len(set(m.CLIENT_REQUESTS)) == len(m.CLIENT_REQUESTS)
    assert set(HANDLERS) == set(m.CLIENT_REQUESTS)
    for handler in HANDLERS.values():
        assert isinstance(handler.place, Place)
    # the job messages touch SQLite and files, and JobWatch waits: never on the loop
    for kind in (m.JobSubmit, m.JobList, m.JobStatus, m.JobCancel, m.JobWatch):
        assert HANDLERS[kind].place is Place.JOBS


_WAITS = {
    ("threading", "wait"),  # Condition.wait, Event.wait
    ("threading", "join"),
    ("queue", "get"),
    ("subprocess", "wait"),
}
_WAITS_C = {"sleep", "select", "poll", "recv", "recvfrom", "accept", "connect", "fsync"}


class _Waits:
    """A profiler that records every call that can wait: threading, queue and subprocess
    waits, and C-level sleeps, polls, socket calls and fsyncs."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "call":
            key = (Path(frame.f_code.co_filename).stem, frame.f_code.co_name)
            if key in _WAITS:
                self.calls.append(".".join(key))
        elif event == "c_call" and getattr(arg, "__name__", "") in _WAITS_C:
            self.calls.append(arg.__name__)

    def run(self, fn, *args):  # type: ignore[no-untyped-def]
        sys.setprofile(self)
        try:
            return fn(*args)
        finally:
            sys.setprofile(None)


def test_loop_handlers_never_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every message the loop runs (by its place, or inline by its known cost) runs on the
    loop under a profiler that sees every wait; a job poll does wait, and is refused there."""
    monkeypatch.setattr(_session, "INLINE_BUDGET", 10.0)  # a slow machine still runs inline
    state = ServerState("cpu")
    state.jobs = JobService(tmp_path / "data")
    try:
        dev, session = loopback_device(state)
        x = dev.tensor(np.ones(4, np.float32))
        assert (x * 2).sum().item() == 8.0  # registers the graph and times its plan
        assert (x * 2).sum().item() == 8.0  # a replay: no RegisterGraph
        replay = dev._rt.link.frames[-1]  # ExecuteGraph + Read of that step
        tid = next(iter(session.store))
        frames = [
            replay,
            m.encode(m.Upload(0, 900, "float32", (2,), b"\0" * 8, 0)),
            m.encode([m.Sync(901), m.MemoryStats(902, 0, 0, 0, 0, 0, 0, 0), m.Resync()]),
            m.encode([m.Expose(903, tid, "a" * 52), m.Read(904, 900), m.Drop((900,))]),
            # group set-up runs on the loop too (this in-process state serves no groups:
            # refused at once, which is what is checked here, without a wait)
            m.encode([m.GroupSetup(905, 9, 0, ("a" * 52,), b"\0" * 32, 1000), m.GroupClose(9)]),
        ]
        for frame in frames:
            session.feed_control(frame)
        kinds = {type(msg) for msg in session.queue}
        assert kinds >= {m.ExecuteGraph, m.Read, m.Upload, m.Sync, m.Drop, m.Expose}
        loop_kinds = {k for k, h in HANDLERS.items() if h.place is Place.LOOP}
        assert loop_kinds <= kinds | {m.Resync}
        waits = _Waits()
        outs = waits.run(session.step, 1.0, Place.LOOP)
        assert not session.queue, "a message the loop should run was left for a worker"
        assert waits.calls == []
        replies = [msg for out in outs for msg in m.decode(out)]
        refused = [r for r in replies if isinstance(r, m.Error)]
        assert [(r.code, r.request_id) for r in refused] == [(m.GROUP, 905)], replies

        # The instrument sees a wait: a job poll waits for events, and the loop refuses it.
        job = state.jobs.store.add_job({"kind": "train"}, "no-such-device", 1, session.peer_id)
        session.feed_control(m.encode(m.JobWatch(905, job, 1)))
        assert session.step(2.0, Place.LOOP) == [] and session.queue
        assert session.next_place() is Place.JOBS
        waits = _Waits()
        outs = waits.run(session.step, 3.0, Place.JOBS)
        assert "threading.wait" in waits.calls
        assert m.decode(outs[0]) == [m.JobEvents(905, job, b"[]")]  # none came in WATCH_WAIT
    finally:
        state.jobs.close()


def test_job_polling_does_not_stall_other_sessions(spawn, tmp_path: Path) -> None:
    """One session long-polls a finished job over and over (each poll waits the full
    WATCH_WAIT, 2 s, for an event that never comes); another session's item() round trips
    go on inside each poll's wait. Before the handler table, every poll froze the loop for 2 s."""
    server = spawn("--data-dir", str(tmp_path / "d"))
    polls = RemoteDevice(server.target)
    job = polls.jobs.submit(failing_spec(tmp_path))
    info = job.watch(progress=False, timeout=60)
    assert info["state"] == "failed"  # terminal: no event will ever come
    last = job.events(0)[-1]["seq"]
    stop = threading.Event()
    count = [0]  # polls answered
    waiting = [False]

    def poll() -> None:
        while not stop.is_set():
            waiting[0] = True
            assert job.events(last) == []
            waiting[0] = False
            count[0] += 1

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    reader = RemoteDevice(server.target, key=tmp_path / "reader-key")
    x = reader.tensor(np.ones(8, np.float32))
    assert (x * 2).sum().item() == 16.0
    during = reads = 0  # reads that began and ended inside one poll's 2 s wait
    while count[0] < 3:
        before = (waiting[0], count[0])
        assert (x * 3).sum().item() == 24.0
        reads += 1
        during += before[0] and waiting[0] and count[0] == before[1]
    stop.set()
    poller.join(10)
    print(f"{reads} reads, {during} of them inside a poll's wait, {count[0]} polls")
    # a loop frozen by the poll would finish no read inside it (each waits for the poll)
    assert during >= 20, (during, reads, count[0])
    reader.close()
    polls.close()
