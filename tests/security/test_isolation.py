"""Ownership by peer id: another authorised peer sees and touches nothing of a peer's jobs,
artifacts and uploads; an ``admin`` (authorised-peers file) sees and cancels everything."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from burn_remote import JobError, RemoteDevice
from burn_remote.protocol import messages as m

from tests.jobs.conftest import wait_for
from tests.jobs.models import lora_spec


def test_another_peer_cannot_see_use_fetch_or_cancel_a_job(
    secure, peers, base, guard_of, raw, tmp_path
):
    server = secure()
    guard = guard_of(server, peers.victim)
    mine = RemoteDevice(server.target, key=peers.victim.key).jobs
    theirs = RemoteDevice(server.target, key=peers.attacker.key).jobs
    admin = RemoteDevice(server.target, key=peers.admin.key).jobs

    secret = tmp_path / "secret.npz"  # a dataset only the victim has
    np.savez(secret, tokens=np.load(base[1])["tokens"][::-1].copy())
    job = mine.submit(lora_spec(base[0], secret, steps=400, checkpoint_every=50))
    data_ref = job.info["spec"]["data"]["path"]
    assert data_ref.startswith("sha256:")
    wait_for(lambda: job.status()["state"] == "running", timeout=60)

    # listing: the attacker sees none of it, the admin sees it with its owner
    assert [j["id"] for j in theirs.list()] == []
    assert [j["id"] for j in mine.list()] == [job.id]
    listed = admin.list()
    assert [j["id"] for j in listed] == [job.id] and listed[0]["owner"] == peers.victim.peer_id
    # status, watch, cancel: answered exactly as for a job that does not exist
    for call in (
        lambda: theirs.get(job.id),
        lambda: theirs._call(m.JobWatch, job.id, 0),
        lambda: theirs._call(m.JobCancel, job.id),
    ):
        with pytest.raises(JobError, match=f"job {job.id}: no such job"):
            call()
    with pytest.raises(JobError, match="no such job"):
        theirs.get(2**64 - 1)  # past SQLite's integers: a named error, not INTERNAL
    spec = lora_spec(*base, steps=5)
    spec["model"]["weights"] = "job:" + "9" * 30
    with pytest.raises(JobError, match="model.weights: job 9+: no such job"):
        theirs.submit(spec)
    # using the victim's dataset or outputs as inputs
    spec = lora_spec(*base, steps=5)
    spec["data"]["path"] = data_ref
    with pytest.raises(JobError, match=r"data.path: no artifact .*upload it first"):
        theirs.submit(spec)
    spec = lora_spec(*base, steps=5)
    spec["model"]["weights"] = f"job:{job.id}"
    with pytest.raises(JobError, match=f"model.weights: job {job.id}: no such job"):
        theirs.submit(spec)
    # fetching the victim's uploaded dataset by its hash
    sha = bytes.fromhex(data_ref.removeprefix("sha256:"))
    with pytest.raises(JobError, match="no such artifact"):
        theirs.download(data_ref, tmp_path / "stolen")
    assert not (tmp_path / "stolen").exists()
    # knowing the hash is not owning the content: a claimed upload needs every byte
    attacker = raw(server, peers.attacker)
    attacker.hello()
    size = len(secret.read_bytes())
    reply = attacker.call(m.ArtifactPut(1, sha, size - 1, size, b"x"))
    assert isinstance(reply, m.Error) and "chunk at" in reply.message
    reply = attacker.call(m.ArtifactGet(2, sha, 0, 100))
    assert isinstance(reply, m.Error) and "no such artifact" in reply.message

    assert job.status()["state"] == "running"  # untouched by all of the above
    guard.check()
    assert admin.get(job.id).cancel()["id"] == job.id  # the admin may
    wait_for(lambda: job.status()["state"] == "cancelled", timeout=60)


def test_same_content_uploaded_by_two_peers_belongs_to_both(secure, peers, tmp_path):
    server = secure()
    one = RemoteDevice(server.target, key=peers.victim.key).jobs
    two = RemoteDevice(server.target, key=peers.attacker.key).jobs
    payload = tmp_path / "data.bin"
    payload.write_bytes(b"shared bytes " * 1000)
    ref = one.upload(payload)
    assert two.upload(payload) == ref  # uploaded in full, checksum verified: now its too
    assert two.download(ref, tmp_path / "back").read_bytes() == payload.read_bytes()


def test_half_upload_of_one_peer_is_not_disturbed_by_another(secure, peers, raw):
    server = secure()
    data = b"a" * (3 * m.ARTIFACT_CHUNK // 2)
    sha = hashlib.sha256(data).digest()
    victim, attacker = raw(server, peers.victim), raw(server, peers.attacker)
    victim.hello()
    attacker.hello()
    first = data[: m.ARTIFACT_CHUNK]
    assert isinstance(victim.call(m.ArtifactPut(1, sha, 0, len(data), first)), m.Ack)
    # the attacker restarts "the" upload of the same hash with other bytes
    assert isinstance(attacker.call(m.ArtifactPut(1, sha, 0, len(data), b"b" * 10)), m.Ack)
    rest = data[m.ARTIFACT_CHUNK :]
    assert isinstance(victim.call(m.ArtifactPut(2, sha, len(first), len(data), rest)), m.Ack)
    got = victim.call(m.ArtifactGet(3, sha, 0, 100))
    assert isinstance(got, m.ArtifactChunk) and got.total == len(data)
    info = victim.call(m.JobList(4, 0, 0))
    assert json.loads(info.info)["jobs"] == []
