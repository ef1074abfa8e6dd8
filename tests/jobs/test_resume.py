"""Durability over real servers: SIGKILL mid-job then restart resumes bit for bit; jobs on one
device queue; cancelling keeps the last checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from burn_remote import RemoteDevice
from burn_remote.server.jobs import JobStore

from tests.jobs.conftest import wait_for
from tests.jobs.models import lora_spec
from tests.remote.conftest import env_with_home, start_server, stop_server


def test_sigkill_mid_lora_job_resumes_to_the_same_adapter(base, tmp_path, client_home):
    data_dir = tmp_path / "server"
    first = start_server(data_dir)
    try:
        jobs = RemoteDevice(first.target).jobs
        job = jobs.submit(lora_spec(*base, steps=120, checkpoint_every=10))
        wait_for(lambda: job.status()["step"] >= 13, timeout=60)
        first.proc.kill()  # SIGKILL: no shutdown path runs
        first.proc.wait(10)
    except BaseException:
        first.proc.kill()
        raise
    killed_at = JobStore(data_dir).job(job.id)
    assert killed_at["state"] == "running" and killed_at["step"] < 120
    assert killed_at["checkpoint_step"] >= 10

    second = start_server(data_dir)  # same --data-dir (and key): the job resumes by itself
    try:
        jobs = RemoteDevice(second.target).jobs
        resumed = jobs.get(job.id)
        assert resumed.wait(timeout=60)["state"] == "succeeded"
        notes = [e.get("message", "") for e in resumed.events(0)]
        assert any("resumed from the checkpoint" in n for n in notes)
        # the same spec uninterrupted (inputs already uploaded, so the refs are identical)
        again = jobs.submit(resumed.info["spec"])
        assert again.wait(timeout=60)["state"] == "succeeded"
        a, b = resumed.fetch(tmp_path / "a"), again.fetch(tmp_path / "b")
        name = "adapter_model.safetensors"
        assert a[name].read_bytes() == b[name].read_bytes()  # bitwise
        assert resumed.info["outputs"] == again.info["outputs"]
        cfg = json.loads(a["adapter_config.json"].read_text())
        assert cfg["peft_type"] == "LORA" and cfg["r"] == 4
    finally:
        stop_server(second)


def test_jobs_on_one_device_queue_and_cancel_keeps_the_checkpoint(base, spawn, tmp_path):
    server = spawn()
    jobs = RemoteDevice(server.target).jobs
    first = jobs.submit(lora_spec(*base, steps=500))
    second = jobs.submit(lora_spec(*base, steps=500, seed=1))
    wait_for(lambda: first.status()["checkpoint_step"] >= 5, timeout=60)
    assert second.status()["state"] == "queued"  # one runner per device: it waits
    info = first.cancel()
    final = wait_for(lambda: first.status()["state"] == "cancelled" and first.info, timeout=30)
    assert info["id"] == first.id
    assert final["checkpoint_step"] >= 5 and Path(final["checkpoint"]).exists()
    assert final["step"] < 500
    started = wait_for(lambda: second.status()["started"], timeout=30)
    assert started >= final["finished"]
    out = subprocess.run(
        [
            str(Path(sys.executable).with_name("burn-remote")),
            "jobs",
            "list",
            "--peer",
            server.target,
        ],
        capture_output=True,
        text=True,
        env=env_with_home(tmp_path / "client-home"),
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "cancelled" in out.stdout and "lora_finetune" in out.stdout
    second.cancel()
    assert second.wait(timeout=30)["state"] == "cancelled"
