"""One peer cannot starve the others: per-peer sessions, jobs, disk and half uploads."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from burn_remote import JobError, RemoteDevice
from burn_remote.protocol import messages as m
from burn_remote.server._state import PEER_MEMORY_SHARE

from tests.jobs.conftest import wait_for
from tests.jobs.models import lora_spec

from .conftest import MEMORY_LIMIT


def test_one_peer_cannot_take_every_session_slot(secure, peers, raw, guard_of):
    server = secure("--max-sessions", "8", "--max-peer-sessions", "4")
    guard = guard_of(server, peers.victim)  # the victim's session: 1 of 8
    mine = [raw(server, peers.attacker) for _ in range(6)]
    answers = [c.hello()[0] for c in mine]
    welcomed = [a for a in answers if isinstance(a, m.Welcome)]
    refused = [a for a in answers if isinstance(a, m.Error)]
    assert len(welcomed) == 4 and len(refused) == 2
    assert all(r.code == m.LIMIT and "max_peer_sessions 4" in r.message for r in refused)
    other = RemoteDevice(server.target, key=peers.admin.key)  # another peer still gets in
    assert other.tensor([2.0]).sum().item() == 2.0
    other.close()
    guard.check()


def test_jobs_uploads_and_disk_are_limited_per_peer(secure, peers, base, raw, guard_of, tmp_path):
    server = secure("--max-peer-jobs", "2", "--peer-disk", "2MiB")
    guard = guard_of(server, peers.victim)
    dev = RemoteDevice(server.target, key=peers.attacker.key)
    jobs = dev.jobs
    first = jobs.submit(lora_spec(*base, steps=400))
    jobs.submit(lora_spec(*base, steps=400, seed=1))
    with pytest.raises(JobError, match="max_peer_jobs 2"):
        jobs.submit(lora_spec(*base, steps=5))
    # the victim's jobs are not limited by the attacker's
    victim_job = RemoteDevice(server.target, key=peers.victim.key).jobs.submit(
        lora_spec(*base, steps=2)
    )
    big = tmp_path / "big.bin"
    big.write_bytes(b"z" * (3 * 2**20))
    with pytest.raises(JobError, match="per-peer disk quota"):
        jobs.upload(big)
    first.cancel()

    # half uploads: at most 8 at a time per peer, and removed when the peer leaves
    attacker = raw(server, peers.attacker)
    attacker.hello()
    store_uploads = server_dir(server) / "uploads"
    for k in range(10):
        data = bytes([k]) * 1000
        sha = hashlib.sha256(data).digest()
        reply = attacker.call(m.ArtifactPut(k + 1, sha, 0, 2000, data))
        if k < 8:
            assert isinstance(reply, m.Ack), reply
        else:
            assert isinstance(reply, m.Error) and "MAX_PEER_UPLOADS" in reply.message
    assert len(list(store_uploads.glob(f"{peers.attacker.peer_id}-*.part"))) == 8
    attacker.close()
    dev.close()  # the attacker's last session ends: its half uploads go
    wait_for(lambda: not list(store_uploads.glob(f"{peers.attacker.peer_id}-*.part")), 30)
    wait_for(lambda: victim_job.status()["state"] in ("queued", "running", "succeeded"), 5)
    guard.check()


def server_dir(server):  # type: ignore[no-untyped-def]
    """The data dir a test daemon was started with (``--data-dir DIR``)."""
    from pathlib import Path

    args = server.proc.args
    return Path(args[args.index("--data-dir") + 1])


MiB = 2**20


def _fill(dev: RemoteDevice, chunk: int = 4 * MiB) -> int:
    """Bytes of tensors ``dev`` holds once the server refuses another ``chunk``."""
    from burn_remote import OpFailed

    held = []
    while True:
        t = dev.tensor(np.zeros(chunk // 4, np.float32))
        try:
            dev.sync()
            t.sum().item()
        except OpFailed as exc:
            assert "memory quota" in str(exc), exc
            return len(held) * chunk
        held.append(t)


def test_by_default_one_peer_cannot_take_all_the_memory(secure, peers, guard_of, tmp_path):
    server = secure()  # three authorised peers, --memory-limit 64 MiB, no --peer-memory
    guard = guard_of(server, peers.victim)
    attacker = RemoteDevice(server.target, key=peers.attacker.key)
    took = _fill(attacker)
    assert took <= PEER_MEMORY_SHARE * MEMORY_LIMIT, took
    victim = guard.dev  # the quarter left is the others': 8 MiB still fits
    assert victim.tensor(np.ones(2 * MiB, np.float32)).sum().item() == 2 * MiB
    guard.check()
    attacker.close()

    # a personal server (one authorised peer) lets that peer use the whole limit
    alone = tmp_path / "alone"
    alone.write_text(f"{peers.victim.peer_id}\n")
    personal = secure("--authorized-peers", str(alone))
    me = RemoteDevice(personal.target, key=peers.victim.key)
    assert _fill(me) > PEER_MEMORY_SHARE * MEMORY_LIMIT
    me.close()
