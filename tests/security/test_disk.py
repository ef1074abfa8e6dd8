"""Disk a peer can make the server fill: job events are bounded per job, and the data
directory as a whole has a limit (``--disk-limit``) and a reserve of free space. Past them a
clear refusal, nothing half written, and nothing accepted before (the peer's own or another
peer's) lost."""

from __future__ import annotations

import numpy as np
import pytest
from burn_remote import JobError, RemoteDevice
from burn_remote.server.jobs import JobService, _disk
from burn_remote.server.jobs import _service as service_module

from tests.jobs.conftest import wait_for
from tests.jobs.models import lora_spec

MiB = 2**20


def test_a_long_job_stores_a_bounded_number_of_events(base, tmp_path, monkeypatch):
    monkeypatch.setattr(service_module, "PROGRESS_EVENTS", 10)
    monkeypatch.setattr(service_module, "MAX_JOB_EVENTS", 20)
    service = JobService(tmp_path / "data")
    try:
        weights, data = (f"sha256:{service.store.put_artifact(p.read_bytes())}" for p in base)
        # 60 steps, a checkpoint each: one event a step and one a checkpoint before
        job = service.submit(lora_spec(weights, data, steps=60, checkpoint_every=1))["id"]
        wait_for(lambda: service.status(job)["state"] == "succeeded", timeout=300)
        events = service.store.events(job, 0, limit=10_000)
        steps = [e["step"] for e in events if "step" in e and e["state"] == "running"]
        assert steps[:2] == [0, 6] or steps[0] == 6, steps  # one every 60 / 10 steps
        assert all(s % 6 == 0 for s in steps), steps
        assert any("MAX_JOB_EVENTS" in e.get("message", "") for e in events), events[-3:]
        assert len(events) <= 20 + 3, len(events)  # + queued, started, succeeded
        assert events[-1]["state"] == "succeeded"  # state changes are always stored
        assert service.status(job)["step"] == 60
    finally:
        service.close()


def test_the_data_dir_limit_refuses_clearly_and_keeps_what_was_stored(
    secure, peers, guard_of, tmp_path
):
    server = secure("--disk-limit", "3MiB")
    guard = guard_of(server, peers.victim)
    mine = tmp_path / "victim.bin"
    mine.write_bytes(np.random.default_rng(0).bytes(2 * MiB))
    victim_jobs = guard.dev.jobs
    kept = victim_jobs.upload(mine)
    attacker = RemoteDevice(server.target, key=peers.attacker.key)
    big = tmp_path / "attacker.bin"
    big.write_bytes(np.random.default_rng(1).bytes(2 * MiB))
    with pytest.raises(JobError, match=r"--disk-limit.*nothing was stored"):
        attacker.jobs.upload(big)
    small = tmp_path / "small.bin"
    small.write_bytes(b"x" * 1000)
    attacker.jobs.upload(small)  # what fits is still taken
    got = tmp_path / "back"
    got.mkdir()
    # the victim's artifact is whole (fetched back by checksum)
    assert victim_jobs.download(kept, got / "v.bin").read_bytes() == mine.read_bytes()
    attacker.close()
    guard.check()


def test_uploads_leave_the_reserve_free(tmp_path, monkeypatch):
    """Near a full disk (here: a reserve larger than the free space) an upload is refused
    before a byte is written, naming the reserve."""
    service = JobService(tmp_path / "data")
    try:
        ref = "sha256:" + service.store.put_artifact(b"stored before the disk filled")
        monkeypatch.setattr(_disk, "reserve", lambda root: 2**62)  # more than any disk has
        with pytest.raises(service_module.JobRefused, match="nearly full.*nothing was stored"):
            service.receive_upload("ab" * 32, 0, 10, b"0123456789", "peer")
        assert not list((service.store.root / "uploads").iterdir())
        with pytest.raises(service_module.JobRefused, match="nearly full"):
            service.submit(lora_spec(ref, ref))
        assert service.list() == []  # nothing queued
        assert service.store.has_artifact(ref.removeprefix("sha256:"))  # nothing lost
    finally:
        service.close()


def test_a_peer_whose_outputs_reached_its_disk_quota_submits_no_more_jobs(
    base, secure, peers, guard_of
):
    inputs = sum(p.stat().st_size for p in base)
    server = secure("--peer-disk", str(inputs + 1000))  # its inputs fit, outputs overflow
    guard = guard_of(server, peers.victim)
    jobs = RemoteDevice(server.target, key=peers.attacker.key).jobs
    first = jobs.submit(lora_spec(*base, steps=2))
    assert first.wait(timeout=120)["state"] == "succeeded"  # accepted work is finished
    with pytest.raises(JobError, match=r"at your disk quota .*--peer-disk.*nothing was queued"):
        jobs.submit(lora_spec(*base, steps=2))
    assert first.status()["outputs"]  # and kept
    victim = guard.dev.jobs.submit(lora_spec(*base, steps=2))  # another peer is not affected
    assert victim.wait(timeout=120)["state"] == "succeeded"
    guard.check()
