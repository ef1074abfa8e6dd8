"""Jobs run on the server's own engine: its memory ledger and limits, its plan cache."""

from __future__ import annotations

import numpy as np
import pytest
from burn_remote import OpFailed, RemoteDevice
from burn_remote.server._state import Limits, ServerState
from burn_remote.server.jobs import JobService

from tests.jobs.conftest import wait_for
from tests.jobs.models import lora_spec


def test_a_job_is_refused_by_the_servers_memory_limit(base, spawn, tmp_path):
    """The base model's weights (~60 KB) do not fit a 16 KiB server; a session's tensor of
    the same size is refused by the same limit, and a small one still fits."""
    server = spawn(
        "--data-dir",
        str(tmp_path / "d"),
        "--memory-limit",
        "16384",
        "--session-memory",
        "1073741824",
        "--peer-memory",
        "0",  # the server's limit is what this test is about, not the per-peer default
    )
    dev = RemoteDevice(server.target)
    job = dev.jobs.submit(lora_spec(*base, steps=3))
    info = job.watch(progress=False, timeout=120)
    assert info["state"] == "failed"
    assert "server memory limit exceeded by job 1" in info["error"], info["error"]
    assert "> 16384 (--memory-limit)" in info["error"]
    with pytest.raises(OpFailed, match=r"server memory limit exceeded by session: .* > 16384"):
        dev.tensor(np.zeros(8192, np.float32)).sum().item()
    assert dev.tensor(np.ones(4, np.float32)).sum().item() == 4.0  # what fits still runs
    assert dev.session_stats()["server_bytes"] < 16384  # the failed job gave back its memory
    dev.close()


def test_jobs_share_the_servers_plan_cache_and_ledger(base, tmp_path):
    state = ServerState("cpu", Limits(memory_limit=64 * 2**20))
    service = JobService(tmp_path / "data", state)
    try:
        assert service.state is state and service.device == "cpu"
        ref = service.store.put_artifact(base[0].read_bytes())
        data = service.store.put_artifact(base[1].read_bytes())
        job = service.submit(lora_spec(f"sha256:{ref}", f"sha256:{data}", steps=2))
        wait_for(lambda: service.status(job["id"])["state"] == "succeeded", timeout=120)
        assert state.executor.compiled > 0  # the job's graphs were compiled into our cache
        assert state.peak_bytes > 0 and state.bytes == 0  # charged while it ran, then freed
    finally:
        service.close()
