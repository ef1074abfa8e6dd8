"""Spec validation (key paths, typos), the store's schema and atomic writes, and checksums of
artifacts over a real server."""

from __future__ import annotations

import errno
import hashlib
import os
import sqlite3

import pytest
from burn_remote import ChecksumError, JobError, RemoteDevice
from burn_remote.protocol import messages as m
from burn_remote.server.jobs import JobStore, SpecError, StoreError, validate
from burn_remote.server.jobs._store import MIGRATIONS, write_atomic

from tests.jobs.models import lora_spec

REF = "sha256:" + "ab" * 32
PEER, PEER2 = "a" * 52, "b" * 52
TOML = f"""
kind = "lora_finetune"
steps = 10
[model]
weights = "{REF}"
[data]
path = "{REF}"
[lora]
r = "8x"
"""


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s["lora"].update(r="8x"), 'lora.r: expected a positive integer, got "8x"'),
        (lambda s: s["lora"].update(rnk=8), "lora.rnk: unknown key; did you mean 'r'?"),
        (lambda s: s["lora"].update(rank=8), "lora.rank: the same as lora.r; give only one"),
        (lambda s: s.update(learning_rate=1), "learning_rate: the same as optimizer.lr; give"),
        (lambda s: s.update(epochs=2), "epochs: give steps or epochs, not both"),
        (lambda s: s.update(stesp=3), "stesp: unknown key; did you mean 'steps'?"),
        (lambda s: s.pop("steps"), "steps: required key is missing"),
        (lambda s: s["optimizer"].update(betas=[0.9]), "optimizer.betas: expected an array"),
        (
            lambda s: s["optimizer"]["groups"][0].update(lr=-1),
            "optimizer.groups[0].lr: expected a positive number, got -1",
        ),
        (lambda s: s["model"].update(weights="/tmp/x"), "model.weights: expected an input ref"),
        (lambda s: s.update(kind="finetune"), 'kind: expected one of "lora_finetune"'),
        (lambda s: s["schedule"].update(warmup_steps=99), "schedule.warmup_steps: 99 exceeds"),
        (lambda s: s.update(devices=["k51qz"]), "devices[0]: not a peer id"),
        (lambda s: s.update(devices=[PEER + "@10.0.0.1:7000"]), "devices[0]: name the server"),
        (lambda s: s.update(devices=[]), "devices: expected an array of 1..64 items"),
        (lambda s: s.update(devices=[PEER, PEER.upper()]), "devices[1]: the server"),
        (
            lambda s: s.update(devices=[PEER, PEER2], batch_size=1),
            "batch_size: 1 samples cannot be split across 2 devices",
        ),
        (
            lambda s: s.update(require_all_devices=True),
            "require_all_devices: only for a job that names devices",
        ),
        (lambda s: s.update(require_all_devices="yes"), "require_all_devices: expected"),
    ],
)
def test_malformed_specs_name_the_key_path(change, message):
    spec = lora_spec(REF, REF)
    change(spec)
    with pytest.raises(SpecError) as info:
        validate(spec)
    assert str(info.value).startswith(message), str(info.value)


def test_toml_specs_and_defaults():
    with pytest.raises(SpecError, match=r'^lora\.r: expected a positive integer, got "8x"$'):
        validate(TOML)
    spec = validate(TOML.replace('"8x"', "8"))
    assert spec["lora"]["alpha"] == 16.0 and spec["optimizer"]["name"] == "adamw"
    assert spec["schedule"]["kind"] == "constant" and spec["checkpoint_every"] == 10
    assert spec["require_all_devices"] is False  # a lost server is dropped, the job goes on
    layers = [{"type": "linear", "in_features": 4, "out_feature": 2}]
    with pytest.raises(SpecError, match=r"model\.layers\[0\]\.out_feature: .*'out_features'"):
        validate(
            {
                "kind": "train",
                "steps": 1,
                "model": {"arch": "sequential", "layers": layers},
                "data": {"path": REF},
            }
        )


def test_store_schema_is_versioned_and_in_wal_mode(tmp_path):
    store = JobStore(tmp_path)
    assert store.schema_version == len(MIGRATIONS)
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    job = store.add_job(validate(lora_spec(REF, REF)), "cpu", 30)
    store.close()
    again = JobStore(tmp_path)  # reopening applies nothing twice
    assert again.job(job)["state"] == "queued" and again.schema_version == len(MIGRATIONS)
    rows = sqlite3.connect(tmp_path / "jobs.sqlite3").execute("SELECT * FROM migrations")
    assert [r[0] for r in rows] == list(range(1, len(MIGRATIONS) + 1))


def test_failed_writes_keep_what_was_accepted(tmp_path, monkeypatch):
    path = tmp_path / "ck" / "ckpt"
    write_atomic(path, b"old")

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError, match="No space"):
        write_atomic(path, b"new")
    assert path.read_bytes() == b"old" and [p.name for p in path.parent.iterdir()] == ["ckpt"]
    store = JobStore(tmp_path / "data")
    job = store.add_job(validate(lora_spec(REF, REF)), "cpu", 30)
    data = b"payload"
    sha = hashlib.sha256(data).hexdigest()
    with pytest.raises(StoreError, match="No space left"):
        store.receive_chunk(sha, 0, len(data), data)
    assert not store.has_artifact(sha) and store.job(job)["state"] == "queued"
    assert list((tmp_path / "data" / "uploads").iterdir()) == []


def test_corrupted_artifacts_fail_their_checksum(base, spawn, tmp_path):
    server = spawn()
    jobs = RemoteDevice(server.target).jobs
    with pytest.raises(JobError, match=r"^lora\.r: expected a positive integer, got \"8x\""):
        jobs.submit(lora_spec(*base, lora={"r": "8x"}))
    with pytest.raises(JobError, match=r"lora\.rnak: unknown key; did you mean 'r'"):
        jobs.submit(lora_spec(*base, lora={"rnak": 8}))
    with pytest.raises(JobError, match=r"model\.weights: no artifact"):
        jobs.submit(lora_spec(REF, base[1]))
    wrong = hashlib.sha256(b"something else").digest()
    with pytest.raises(JobError, match="checksum mismatch"):
        jobs._call(m.ArtifactPut, wrong, 0, 5, b"hello")
    ref = jobs.upload(base[0])
    sha = ref.removeprefix("sha256:")
    stored = server_dir(server) / "artifacts" / sha[:2] / sha
    good = stored.read_bytes()
    assert jobs.download(ref, tmp_path / "ok.safetensors").read_bytes() == good
    stored.write_bytes(good[:-4] + bytes(4 ^ b for b in good[-4:]))  # flip bits on the server
    with pytest.raises(ChecksumError, match="failed its checksum"):
        jobs.download(ref, tmp_path / "bad.safetensors")
    assert not (tmp_path / "bad.safetensors").exists()
    with pytest.raises(JobError, match="corrupted"):  # read at submit (the model's layers)
        jobs.submit(lora_spec(ref, base[1], steps=3))


def server_dir(server):
    """The --data-dir of a spawned server (from its command line)."""
    from pathlib import Path

    args = server.proc.args
    return Path(args[args.index("--data-dir") + 1])
