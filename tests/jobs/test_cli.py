"""`burn-remote jobs` from a shell: --json on every action, a failure's reason printed by
submit --watch, the state cancel leaves a job in, and missing files refused up front."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.jobs.conftest import wait_for
from tests.jobs.models import failing_spec, lora_spec
from tests.remote.conftest import env_with_home

EXE = str(Path(sys.executable).with_name("burn-remote"))


def _jobs(
    home: Path, *args: str, timeout: float = 180, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [EXE, "jobs", *args], capture_output=True, text=True, env=env_with_home(home),
        timeout=timeout, cwd=cwd,
    )  # fmt: skip


def _toml(spec: dict, path: Path) -> Path:
    def value(v):  # type: ignore[no-untyped-def]
        return json.dumps(v)

    lines = []
    tables = {k: v for k, v in spec.items() if isinstance(v, dict)}
    for k, v in spec.items():
        if not isinstance(v, dict):
            lines.append(f"{k} = {value(v)}")
    for name, table in tables.items():
        lines.append(f"[{name}]")
        for k, v in table.items():
            if isinstance(v, list) and v and isinstance(v[0], dict):
                continue  # optimizer groups: not needed here
            lines.append(f"{k} = {value(v)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jobs_cli(base, spawn, tmp_path, client_home):  # type: ignore[no-untyped-def]
    server = spawn("--data-dir", str(tmp_path / "d"))
    peer = ("--peer", server.target)

    missing = _jobs(client_home, "submit", str(tmp_path / "nope.toml"), *peer)
    assert missing.returncode == 2 and "no such spec file" in missing.stderr

    spec = lora_spec(*base, steps=3)
    spec["optimizer"].pop("groups")
    gone = dict(spec, model=dict(spec["model"], weights=str(tmp_path / "no-weights.st")))
    out = _jobs(client_home, "submit", str(_toml(gone, tmp_path / "gone.toml")), *peer)
    assert out.returncode == 1
    assert f"model.weights: no such file: {tmp_path / 'no-weights.st'}" in out.stderr

    good = _jobs(client_home, "submit", str(_toml(spec, tmp_path / "ok.toml")), *peer, "--json")
    assert good.returncode == 0, good.stderr
    first = json.loads(good.stdout)
    assert first["state"] in ("queued", "running") and first["kind"] == "lora_finetune"

    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not safetensors")
    bad = dict(spec, model=dict(spec["model"], weights=str(garbage)))
    refused = _jobs(client_home, "submit", str(_toml(bad, tmp_path / "bad.toml")), *peer)
    assert refused.returncode == 1 and "model.weights: not a safetensors file" in refused.stderr
    bad = failing_spec(tmp_path, steps=3)  # accepted, but its run fails
    failed = _jobs(client_home, "submit", str(_toml(bad, tmp_path / "bad.toml")), *peer, "--watch")
    assert failed.returncode == 1
    assert "failed:" in failed.stderr and "job 2" in failed.stderr, failed.stderr

    listed = _jobs(client_home, "list", *peer, "--json")
    assert [j["id"] for j in json.loads(listed.stdout)] == [1, 2]
    text = _jobs(client_home, "list", *peer)
    header, *rows = text.stdout.splitlines()
    assert header.split() == ["ID", "NAME", "KIND", "STATE", "STEP", "AGE"]
    assert rows[1].split()[:5] == ["2", "-", "lora_finetune", "failed", "0/3"], rows
    status = json.loads(_jobs(client_home, "status", "2", *peer, "--json").stdout)
    assert status["state"] == "failed" and status["error"]
    human = _jobs(client_home, "status", "2", *peer)
    assert "state: failed" in human.stdout
    watched = _jobs(client_home, "watch", "1", *peer, "--json")
    assert watched.returncode == 0 and json.loads(watched.stdout)["state"] == "succeeded"
    fetched = _jobs(client_home, "fetch", "1", str(tmp_path / "out"), *peer, "--json")
    assert "adapter_model.safetensors" in json.loads(fetched.stdout)

    long = _jobs(
        client_home, "submit", str(_toml(dict(spec, steps=100000), tmp_path / "l.toml")), *peer,
        "--json",
    )  # fmt: skip
    job = json.loads(long.stdout)["id"]
    wait_for(
        lambda: (
            json.loads(_jobs(client_home, "status", str(job), *peer, "--json").stdout)["state"]
            == "running"
        ),
        timeout=60,
    )
    cancelled = _jobs(client_home, "cancel", str(job), *peer)  # returns at once
    assert cancelled.returncode == 0, cancelled.stderr
    # the job may already have stopped at a step boundary by the time the reply is made
    said = (f"job {job}: cancel requested", f"job {job}: cancelled")
    assert cancelled.stdout.startswith(said), cancelled.stdout
    waited = _jobs(client_home, "cancel", str(job), *peer, "--wait")  # blocks until stopped
    assert waited.stdout.startswith(f"job {job}: cancelled"), waited.stdout

    events = _jobs(client_home, "events", "1", *peer)
    lines = events.stdout.splitlines()
    assert events.returncode == 0 and "queued" in lines[0] and "succeeded" in lines[-1], lines
    assert any("loss" in line and "step" in line for line in lines)
    as_json = json.loads(_jobs(client_home, "events", "1", *peer, "--json").stdout)
    assert [e["seq"] for e in as_json] == list(range(1, len(lines) + 1))


def test_the_documented_address_book_serves_remote_device_and_jobs_peer(
    spawn, tmp_path, client_home, monkeypatch
):  # type: ignore[no-untyped-def]
    """One format, one reader: a [[peer]] entry (by id or by name) is what RemoteDevice and
    `jobs --peer` dial."""
    from burn_remote import RemoteDevice

    server = spawn("--data-dir", str(tmp_path / "d"))
    monkeypatch.delenv("BURN_REMOTE_ADDRESS_BOOK", raising=False)
    (client_home / "addresses.toml").write_text(
        f'[[peer]]\nid = "{server.peer_id}"\nname = "lab"\naddresses = ["{server.address}"]\n'
    )
    for target in (server.peer_id, "lab"):
        dev = RemoteDevice(target)
        assert dev.peer_id == server.peer_id
        assert dev.tensor(np.ones(3, np.float32)).sum().item() == 3.0
        dev.close()
        listed = _jobs(client_home, "list", "--peer", target, "--json")
        assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed.stderr
    (client_home / "addresses.toml").write_text(f'"{server.peer_id}" = "{server.address}"\n')
    old = _jobs(client_home, "list", "--peer", server.peer_id)
    assert old.returncode == 1 and "is not part of its format" in old.stderr


def test_a_job_list_larger_than_a_frame_comes_in_pages(tmp_path, client_home):  # type: ignore[no-untyped-def]
    """40 jobs with 60 KB specs (2.4 MB of rows) on a server whose frames stop at 1 MiB:
    `jobs list` still shows them all, page by page, before and after a restart."""
    from burn_remote import RemoteDevice
    from burn_remote.protocol.transport import Identity
    from burn_remote.server.jobs import JobStore
    from burn_remote.server.testing import start_server

    me = str(Identity.load_or_create(client_home / "key").peer_id)
    data = tmp_path / "d"
    store = JobStore(data)
    for _ in range(40):  # on a device no runner serves: they stay queued
        store.add_job({"kind": "train", "note": "x" * 60_000}, "elsewhere", 1, owner=me)
    store.close()
    for _ in range(2):  # and again after a restart
        server = start_server(data, "--max-frame", "1MiB")
        try:
            jobs = RemoteDevice(server.target).jobs
            first = jobs.page()
            assert 0 < len(first["jobs"]) < 40 and first["next"] == first["jobs"][-1]["id"]
            assert [j["id"] for j in jobs.list()] == list(range(1, 41))
            out = _jobs(client_home, "list", "--peer", server.target, "--json")
            assert out.returncode == 0, out.stderr
            assert len(json.loads(out.stdout)) == 40
        finally:
            server.stop()
