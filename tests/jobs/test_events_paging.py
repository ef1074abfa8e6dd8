"""`burn-remote jobs events` on a job with more events than one JobEvents page holds: every
event comes, in order, none twice, page by page, however small the server's frames; `--after`
carries on from an event, `--follow` prints new ones as they come until the job ends."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from burn_remote.protocol.messages import JOB_EVENTS_PAGE

from tests.remote.conftest import env_with_home

EXE = str(Path(sys.executable).with_name("burn-remote"))
N_EVENTS = 2 * JOB_EVENTS_PAGE + 500
"""Events seeded: more than two full pages."""
HEAVY = 1500
"""Events above this one carry MESSAGE: pages there are cut by size, below it by count."""
MESSAGE = "m" * 2000
"""A page of JOB_EVENTS_PAGE such events (2 MB) would pass a 1 MiB frame."""


def _jobs(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [EXE, "jobs", *args], capture_output=True, text=True, env=env_with_home(home),
        timeout=timeout,
    )  # fmt: skip


@pytest.fixture
def seeded(tmp_path, client_home):  # type: ignore[no-untyped-def]
    """A server (frames of at most 1 MiB) whose store holds one queued job of the client's,
    on a device no runner serves (so it stays queued), with N_EVENTS events after its own
    "queued" one, stored through the server's job store."""
    from burn_remote.protocol.transport import Identity
    from burn_remote.server.jobs import JobStore
    from burn_remote.server.testing import start_server

    me = str(Identity.load_or_create(client_home / "key").peer_id)
    data = tmp_path / "d"
    store = JobStore(data)
    job = store.add_job({"kind": "train"}, "elsewhere", N_EVENTS, owner=me)
    store.db.execute("PRAGMA synchronous=OFF")  # seeding only: no fsync per event (22 s -> 1 s)
    for step in range(1, N_EVENTS + 1):
        event = {"state": "running", "step": step, "total": N_EVENTS, "loss": 1.0 / step}
        store.add_event(job, {**event, "message": MESSAGE} if step > HEAVY else event)
    total = store.event_count(job)
    store.close()
    server = start_server(data, "--max-frame", "1MiB")
    try:
        yield server, job, total
    finally:
        server.stop()


def test_every_event_comes_once_in_order_page_by_page(seeded, client_home):  # type: ignore[no-untyped-def]
    from burn_remote import RemoteDevice

    server, job, total = seeded
    assert total == N_EVENTS + 1  # add_job's "queued" event, then ours
    peer = ("--peer", server.target)

    handle = RemoteDevice(server.target).jobs.get(job)
    page = handle.events(0)  # small events: a page of JOB_EVENTS_PAGE
    assert [e["seq"] for e in page] == list(range(1, JOB_EVENTS_PAGE + 1))
    page = handle.events(HEAVY)  # large ones: cut at half the frame, below the count
    assert 0 < len(page) < JOB_EVENTS_PAGE and len(json.dumps(page)) <= 1024 * 1024 // 2
    assert [e["seq"] for e in page] == list(range(HEAVY + 1, HEAVY + 1 + len(page)))
    assert [e["seq"] for e in handle.follow(0, until_end=False)] == list(range(1, total + 1))

    as_json = _jobs(client_home, "events", str(job), *peer, "--json")
    assert as_json.returncode == 0, as_json.stderr
    events = json.loads(as_json.stdout)
    assert [e["seq"] for e in events] == list(range(1, total + 1))
    assert [e.get("step") for e in events[1:]] == list(range(1, N_EVENTS + 1))

    text = _jobs(client_home, "events", str(job), *peer)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert [int(line.split()[0]) for line in lines] == list(range(1, total + 1))
    assert "queued" in lines[0] and f"step {N_EVENTS}/{N_EVENTS}" in lines[-1]

    rest = _jobs(client_home, "events", str(job), *peer, "--json", "--after", "1200")
    assert [e["seq"] for e in json.loads(rest.stdout)] == list(range(1201, total + 1))
    bad = _jobs(client_home, "events", str(job), *peer, "--after", "-3")
    assert bad.returncode == 2 and "'-3' is not an event number" in bad.stderr


def test_follow_prints_new_events_until_the_job_ends(seeded, client_home):  # type: ignore[no-untyped-def]
    server, job, total = seeded
    peer = ("--peer", server.target)
    follow = subprocess.Popen(
        [EXE, "jobs", "events", str(job), *peer, "--follow", "--json", "--after", "10"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_with_home(client_home),
    )  # fmt: skip
    try:
        assert follow.stdout is not None
        seqs = [json.loads(follow.stdout.readline())["seq"] for _ in range(total - 10)]
        assert seqs == list(range(11, total + 1))  # the stored ones, one JSON object a line
        assert follow.poll() is None  # the job is still queued: it keeps following
        cancelled = _jobs(client_home, "cancel", str(job), *peer)  # a new event, and the end
        assert cancelled.returncode == 0, cancelled.stderr
        out, err = follow.communicate(timeout=60)
    finally:
        follow.kill()
        follow.wait()
    assert follow.returncode == 0, err
    last = [json.loads(line) for line in out.splitlines()]
    assert [(e["seq"], e["state"]) for e in last] == [(total + 1, "cancelled")]

    ended = _jobs(client_home, "events", str(job), *peer, "--follow", "--after", str(total + 1))
    assert ended.returncode == 0 and ended.stdout == ""  # an ended job: nothing to wait for
