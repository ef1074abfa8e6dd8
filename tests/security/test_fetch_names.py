"""`jobs fetch` writes only inside its destination, whatever names a (compromised) server
gives a job's outputs: each name is checked before anything is written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from burn_remote import JobError, RemoteDevice
from burn_remote._jobs import output_path
from burn_remote.server.jobs import JobStore
from burn_remote.server.testing import start_daemon

BAD_NAMES = ["../../x", "/tmp/abs", "a/b", "..", ".", "", "a\\b", "nul\0", "\n", "x" * 300]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_output_names_that_are_not_plain_file_names_are_refused(tmp_path, name):
    with pytest.raises(JobError, match="nothing written|outside"):
        output_path(tmp_path, name)


def test_plain_names_are_accepted(tmp_path):
    for name in ("adapter_model.safetensors", "model.onnx", "..hidden", "a..b"):
        assert output_path(tmp_path, name) == tmp_path / name


def _compromised_server(tmp_path: Path, peers, name: str):  # type: ignore[no-untyped-def]
    """A data dir whose job store claims a succeeded job with an output called ``name``
    (what a compromised server would send), then a real server on it."""
    data = tmp_path / "server"
    store = JobStore(data)
    sha = store.put_artifact(b"evil bytes", owner=peers.victim.peer_id)
    job = store.add_job({"kind": "train"}, "cpu", 1, peers.victim.peer_id)
    store.update(job, state="succeeded", outputs={name: sha, "fine.txt": sha})
    store.close()
    server = start_daemon("serve", data, "--device", "cpu", "--authorized-peers", str(peers.file))
    return server, job


def test_fetch_from_a_server_naming_dot_dot_writes_nothing(tmp_path, peers):
    server, job = _compromised_server(tmp_path, peers, "../../escaped")
    try:
        dest = tmp_path / "deep" / "er" / "dest"
        jobs = RemoteDevice(server.target, key=peers.victim.key).jobs
        with pytest.raises(JobError, match="'../../escaped'.*path separator"):
            jobs.get(job).fetch(dest)
        assert not (tmp_path / "deep" / "escaped").exists()
        assert not dest.exists() or not any(dest.iterdir())  # not even the fine one
        # the command line says the same in one line and exits 1
        exe = Path(sys.executable).with_name("burn-remote")
        out = subprocess.run(
            [str(exe), "jobs", "fetch", str(job), str(dest), "--peer", server.target]
            + ["--key", str(peers.victim.key)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode != 0
        assert "path separator" in out.stderr and "Traceback" not in out.stderr
        assert not (tmp_path / "deep" / "escaped").exists()
    finally:
        assert server.stop() == 0
