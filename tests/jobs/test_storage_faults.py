"""The job runner outlives a full disk: the job goes back to the queue, the runner retries,
and once space returns that job and every later one run. Nothing accepted is lost."""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from burn_remote import JobError, RemoteDevice
from burn_remote.server.jobs import JobService, JobStore
from burn_remote.server.jobs import _service as service_module

from tests.jobs.conftest import wait_for
from tests.jobs.models import lora_spec, make_base


def _refs(service: JobService, base: tuple[Path, Path]) -> tuple[str, str]:
    return tuple(f"sha256:{service.store.put_artifact(p.read_bytes())}" for p in base)  # type: ignore[return-value]


def test_runner_survives_write_errors_and_retries(base, tmp_path, monkeypatch):
    """Every job-store write fails for a while (as on a full disk); the running job is
    queued again instead of failed, and when writes work again it and the next one run."""
    monkeypatch.setattr(service_module, "RETRY_MIN", 0.05)
    service = JobService(tmp_path / "data")
    try:
        weights, data = _refs(service, base)
        full = {"on": False}
        real_update = JobStore.update

        def update(self, job_id, **fields):  # type: ignore[no-untyped-def]
            if full["on"] and fields.get("step", 0) >= 2:
                raise sqlite3.OperationalError("database or disk is full")
            return real_update(self, job_id, **fields)

        monkeypatch.setattr(JobStore, "update", update)
        full["on"] = True
        first = service.submit(lora_spec(weights, data, steps=6))["id"]
        wait_for(lambda: service.storage_error is not None, timeout=60)
        assert "database or disk is full" in service.storage_error
        assert service._thread.is_alive()
        assert service.status(first)["state"] in ("queued", "running")  # not failed
        full["on"] = False  # space is back
        second = service.submit(lora_spec(weights, data, steps=2))["id"]
        for job in (first, second):
            wait_for(lambda j=job: service.status(j)["state"] == "succeeded", timeout=120)
        assert service.storage_error is None
        assert service.state.errors["job_storage"] >= 1
    finally:
        service.close()


def test_submit_on_a_full_store_is_refused_whole(tmp_path, monkeypatch):
    service = JobService(tmp_path / "data")
    try:
        weights, data = make_base(tmp_path)  # real files: a submit reads their headers
        w_ref = "sha256:" + service.store.put_artifact(weights.read_bytes())
        d_ref = "sha256:" + service.store.put_artifact(data.read_bytes())

        def full(*a, **k):  # type: ignore[no-untyped-def]
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(JobStore, "add_job", full)
        spec = lora_spec(w_ref, d_ref, steps=2)
        with pytest.raises(Exception, match=r"cannot be written .*No space left.* nothing was"):
            service.submit(spec)
        assert service.list() == []
    finally:
        service.close()


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 6 MiB tmpfs, mounted for this test (needs root, as CI runs)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(disk: Path) -> Path:
    filler = disk / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


@pytest.mark.slow
def test_a_real_full_disk_then_freed(base, spawn, small_disk):
    """The server's data directory on a small tmpfs: a job runs; the disk fills; what is
    submitted then is refused clearly or waits; the disk is freed; jobs run again, and the
    first job's row and outputs are intact."""
    server = spawn("--data-dir", str(small_disk / "d"))
    jobs = RemoteDevice(server.target).jobs
    first = jobs.submit(lora_spec(*base, steps=3))
    assert first.wait(timeout=120)["state"] == "succeeded"
    outputs = first.status()["outputs"]
    weights = jobs.upload(base[0])
    data = jobs.upload(base[1])
    filler = _fill(small_disk)
    try:
        queued = jobs.submit(lora_spec(weights, data, steps=3))
    except JobError as exc:  # the row did not fit: refused whole, with the reason
        assert "cannot be written" in str(exc) or "full" in str(exc), str(exc)
        queued = None
    print("submitted on a full disk:", "refused" if queued is None else queued.status())
    filler.unlink()
    if queued is None:
        queued = jobs.submit(lora_spec(weights, data, steps=3))
    assert queued.wait(timeout=180)["state"] == "succeeded"
    later = jobs.submit(lora_spec(weights, data, steps=2))
    assert later.wait(timeout=120)["state"] == "succeeded"
    assert first.status()["outputs"] == outputs
    assert [j["id"] for j in jobs.list()] == [first.id, queued.id, later.id]
