"""Memory limits with no way around them (``--memory-limit 64 MiB``): bulk streams no Upload
claims, exposed tensors, graph constants, arenas of intermediates. Each attack is refused
with LIMIT, the server stays up, the victim keeps its latency, the server's RSS stays within
the limit plus a stated overhead, and what the attacker held is freed when it leaves."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from burn_remote import OpFailed, RemoteDevice
from burn_remote.protocol import messages as m

from .conftest import MEMORY_LIMIT, RSS_OVERHEAD, rss

MiB = 2**20


def _settle(guard, target: int, timeout: float = 20.0) -> int:  # type: ignore[no-untyped-def]
    """The server's RSS once it falls to ``target`` (freed memory returns to the OS)."""
    deadline = time.monotonic() + timeout
    while True:
        now = rss(guard.server.proc.pid)
        if now <= target or time.monotonic() > deadline:
            return now
        time.sleep(0.2)


def test_unclaimed_bulk_streams_are_charged_and_refused(
    server_engine, secure, peers, raw, guard_of
):
    server = secure()
    guard = guard_of(server, peers.victim)
    attacker = raw(server, peers.attacker)
    attacker.hello()
    payload = b"\0" * (32 * MiB)
    senders = []
    for bulk_id in range(1, 25):  # the 24 x 32 MiB, never claimed by an Upload
        t = threading.Thread(target=_quietly, args=(attacker.bulk, bulk_id, payload), daemon=True)
        t.start()
        senders.append(t)
    for t in senders:
        t.join(timeout=30)  # refused streams are stopped: their writers end
        guard.sample_rss()
    # Uploads naming them now: at most two fit under 64 MiB, the others were refused
    answers = []
    for bulk_id in range(1, 25):
        upload = m.Upload(0, bulk_id, "uint8", (32 * MiB,), b"", bulk_id)
        attacker.send(upload, m.Sync(1000 + bulk_id))
        while True:
            got = attacker.replies(timeout=30)
            answers += got
            if any(isinstance(r, m.Ack) and r.request_id == 1000 + bulk_id for r in got):
                break
        guard.sample_rss()
    limits = [a for a in answers if isinstance(a, m.Error) and a.code == m.LIMIT]
    assert len(limits) >= 22, answers[:4]
    assert "memory" in limits[0].message
    guard.check()
    attacker.close()
    assert _settle(guard, guard.rss0 + RSS_OVERHEAD) <= guard.rss0 + RSS_OVERHEAD


def _quietly(fn, *args) -> None:  # type: ignore[no-untyped-def]
    try:
        fn(*args)
    except Exception:
        pass  # a stream the server stopped: the attacker's problem


def test_exposed_tensors_are_charged_until_redeemed_or_the_session_ends(secure, peers, guard_of):
    server = secure()
    guard = guard_of(server, peers.victim)
    dev = RemoteDevice(server.target, key=peers.attacker.key)
    refused = 0
    for _ in range(16):  # the Upload + Expose + Drop, 16 x 32 MiB
        t = dev.tensor(np.ones(8 * MiB, np.float32))
        try:
            dev._rt.expose(t._id, peers.admin.peer_id)
        except OpFailed as exc:
            assert "memory" in str(exc)
            refused += 1
        del t
        guard.sample_rss()
    assert refused >= 14  # one or two fit in 64 MiB, the rest are refused
    guard.check()
    dev.close()
    settled = _settle(guard, guard.rss0 + RSS_OVERHEAD)
    assert settled <= guard.rss0 + RSS_OVERHEAD, "exposed tensors outlived their session"


def test_graph_constants_and_arenas_are_charged_before_they_are_allocated(secure, peers, guard_of):
    server = secure()
    guard = guard_of(server, peers.victim)
    dev = RemoteDevice(server.target, key=peers.attacker.key)
    for _ in range(3):  # the three graphs with 1 GiB `full` constants
        with pytest.raises(OpFailed, match="memory limit"):
            dev.full((2**28,), 1.0).sum().item()
    x = dev.tensor(np.ones(1, np.float32))
    with pytest.raises(OpFailed, match="intermediates"):  # a 1 GiB intermediate
        (x.expand(2**28) * 2.0).sum().item()
    guard.sample_rss()
    # 24 MiB of constants (and as much of arena) fit; the constants stay charged while the
    # attacker is here ...
    assert dev.full((6 * MiB,), 1.0).sum().item() == 6 * MiB
    victim = guard.dev
    with pytest.raises(OpFailed, match="memory limit"):
        victim.full((6 * MiB,), 2.0).sum().item()
    dev.close()  # ... and leave with the last session that registered them
    deadline = time.monotonic() + 10
    while True:
        try:
            assert victim.full((6 * MiB,), 3.0).sum().item() == 18 * MiB
            break
        except OpFailed:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    guard.check()
    assert guard.peak_rss <= guard.rss0 + MEMORY_LIMIT + RSS_OVERHEAD
