"""Durable state under damage: a checkpoint with a flipped bit is never resumed from (the job
falls back to the previous good one and says so); an empty or garbage job store is refused
at start with one line pointing at the backup, never replaced by an empty one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from burn_remote.server.jobs import JobService, JobStore, StoreError

from tests.jobs.conftest import wait_for
from tests.jobs.models import lora_spec


def _submit(service: JobService, base, **kw):  # type: ignore[no-untyped-def]
    refs = [f"sha256:{service.store.put_artifact(p.read_bytes())}" for p in base]
    return service.submit(lora_spec(*refs, **kw))["id"]


def _adapter(service: JobService, job: int) -> bytes:
    sha = service.status(job)["outputs"]["adapter_model.safetensors"]
    return service.store.verified_path(sha).read_bytes()


def test_a_flipped_bit_in_a_checkpoint_falls_back_to_the_previous_good_one(base, tmp_path):
    spec = {"steps": 40, "checkpoint_every": 2}
    reference = JobService(tmp_path / "ref")
    try:
        ref_job = _submit(reference, base, **spec)
        wait_for(lambda: reference.status(ref_job)["state"] == "succeeded", timeout=120)
        want = _adapter(reference, ref_job)
    finally:
        reference.close()

    data = tmp_path / "data"
    service = JobService(data)
    job = _submit(service, base, **spec)
    wait_for(lambda: service.status(job)["checkpoint_step"] >= 6, timeout=120)
    service.close()  # a shutdown: the job is queued again at its last checkpoint
    folder = data / "checkpoints" / str(job)
    sealed = sorted(folder.glob("step-*.safetensors"))
    assert len(sealed) == 2, sealed  # the newest and one to fall back to
    older, newest = sealed
    raw = bytearray(newest.read_bytes())
    raw[len(raw) // 2] ^= 0x04  # one bit, in the tensor data
    newest.write_bytes(bytes(raw))

    again = JobService(data)
    try:
        wait_for(lambda: again.status(job)["state"] == "succeeded", timeout=120)
        notes = [e.get("message", "") for e in again.store.events(job, 0)]
        step_of = int(newest.name[5:14])
        assert any(f"checkpoint at step {step_of} failed its checksum" in n for n in notes), notes
        assert any(f"falling back to {older.name}" in n for n in notes), notes
        assert any(
            f"resumed from the checkpoint at step {int(older.name[5:14])}" in n for n in notes
        )
        assert _adapter(again, job) == want  # bit for bit the uninterrupted result
        assert (folder / f"{newest.name}.damaged").exists()
    finally:
        again.close()


def _store_with_jobs(data: Path, n: int = 4) -> None:
    store = JobStore(data)
    for _ in range(n):
        store.add_job({"kind": "train"}, "cpu", 1)
    store.close()


def _serve(data: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("burn-remote")
    return subprocess.run(
        [str(exe), "serve", "--allow-any", "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda p: p.write_bytes(b""), "is empty (0 bytes)"),
        (lambda p: p.write_bytes(b"garbage!" * 512), "cannot be read as an SQLite database"),
        (
            lambda p: p.write_bytes(p.read_bytes()[:100] + b"\xff" * (p.stat().st_size - 100)),
            "",
        ),
    ],
    ids=["empty", "garbage", "pages-overwritten"],
)
def test_a_damaged_store_is_refused_with_one_line_pointing_at_the_backup(tmp_path, damage, why):
    data = tmp_path / "data"
    _store_with_jobs(data)
    JobStore(data).close()  # a good start: writes the backup
    db = data / "jobs.sqlite3"
    for extra in data.glob("jobs.sqlite3-*"):  # WAL files checkpointed at close
        extra.unlink()
    damage(db)
    with pytest.raises(StoreError) as info:
        JobStore(data)
    text = str(info.value)
    assert why in text and "\n" not in text
    assert f"cp {data / 'jobs.sqlite3.bak'} {db}" in text
    out = _serve(data)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("burn-remote serve: job store"), out.stderr
    assert "Traceback" not in out.stderr
    assert db.exists() and (db.stat().st_size == 0 or db.read_bytes() != b"")  # untouched
    (data / "jobs.sqlite3.bak").replace(db)  # the fix the line gives
    assert len(JobStore(data).jobs()) == 4  # nothing lost
