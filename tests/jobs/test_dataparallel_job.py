"""A LoRA fine-tuning job that names several servers (`devices = [...]`) trains on them
data-parallel, coordinated by the server it was submitted to, and ends with the adapter one
server training on the whole batch makes (within the rounding of another summation order);
a malformed peer id is refused at submission naming its key path, and a server that cannot be
reached fails the job before its first step, naming it."""

from __future__ import annotations

import numpy as np
import pytest
from burn_remote import JobError, RemoteDevice
from burn_remote.nn._serialize import load_arrays
from burn_remote.server.testing import start_daemon

from tests.jobs.models import lora_spec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STEPS = 12
ADAPTER = "adapter_model.safetensors"


def _spec(base, **extra):
    """No dropout: replicas draw other masks than one server on the whole batch would."""
    spec = lora_spec(*base, **{"steps": STEPS, "checkpoint_every": 4, **extra})
    spec["model"]["dropout"] = 0.0
    spec["lora"]["dropout"] = 0.0
    return spec


def _coordinator_and_replicas(tmp_path, n: int):
    """A coordinator server and ``n`` replica servers that know each other's addresses (the
    coordinator knows the replicas): (coordinator, replicas)."""
    coordinator = start_daemon("serve", tmp_path / "c", "--device", "cpu", "--allow-any")
    replicas = [
        start_daemon("serve", tmp_path / f"r{k}", "--device", "cpu", "--allow-any")
        for k in range(n)
    ]
    for r in replicas:
        r.know(*[o for o in replicas if o is not r])
    coordinator.know(*replicas)
    return coordinator, replicas


def _one_server_oracle(jobs, base, steps: int | None, tmp_path) -> dict:
    """The adapter of the spec run on the coordinator alone, on the whole batch: what
    data-parallel must equal."""
    alone = jobs.submit(_spec(base) if steps is None else _spec(base, steps=steps))
    assert alone.wait(timeout=120)["state"] == "succeeded", alone.status()
    return load_arrays(alone.fetch(tmp_path / "alone")[ADAPTER])


def _assert_same_adapter(want: dict, job, tmp_path) -> None:
    """The job's adapter equals the one-server oracle's, within float tolerance of another
    summation order."""
    got = load_arrays(job.fetch(tmp_path / f"job-{job.id}")[ADAPTER])
    assert want.keys() == got.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_a_job_naming_two_servers_trains_like_one_server(base, tmp_path, client_home):
    # the spec names peer ids: the coordinator finds them itself (its address book)
    coordinator, replicas = _coordinator_and_replicas(tmp_path, 2)
    try:
        jobs = RemoteDevice(coordinator.target).jobs
        a = _one_server_oracle(jobs, base, None, tmp_path)
        parallel = jobs.submit(_spec(base, devices=[r.peer_id for r in replicas]))
        done = parallel.wait(timeout=180)
        assert done["state"] == "succeeded", done
        notes = [e.get("message", "") for e in parallel.events(0)]
        assert any("data-parallel on 2 servers" in n for n in notes), notes
        assert any(e.get("checkpoint") == 4 for e in parallel.events(0))  # one copy, here
        _assert_same_adapter(a, parallel, tmp_path)
        assert any(np.abs(a[n]).max() > 0 for n in a if "lora_B" in n)  # it trained
    finally:
        for d in [coordinator, *replicas]:
            d.stop()


def test_a_typo_is_refused_and_an_unreachable_server_fails_the_job(base, spawn, tmp_path):
    server = spawn()
    jobs = RemoteDevice(server.target).jobs
    with pytest.raises(JobError, match=r"devices\[1\]: not a peer id"):
        jobs.submit(_spec(base, devices=[server.peer_id, "k51qz-typo"]))
    with pytest.raises(JobError, match=r"devices\[1\]: the server .* is also devices\[0\]"):
        jobs.submit(_spec(base, devices=[server.peer_id, server.peer_id]))
    # an address in the spec is refused: the server dials only what it resolves itself
    with pytest.raises(JobError, match=r"devices\[0\]: name the server by its peer id only"):
        jobs.submit(_spec(base, devices=[server.target]))
    gone = start_daemon("serve", tmp_path / "gone", "--device", "cpu", "--allow-any")
    gone.stop()  # a real peer id whose server is down
    server.know(gone, server)
    job = jobs.submit(_spec(base, devices=[gone.peer_id, server.peer_id]))
    with pytest.raises(JobError, match=r"devices\[0\] \(.*\): cannot reach this server") as info:
        job.wait(timeout=120)
    assert gone.peer_id[:12] in str(info.value) and "not running" in str(info.value)
    assert job.status()["step"] == 0  # refused before its first step


def test_a_data_parallel_job_killed_mid_way_resumes_from_its_one_checkpoint(
    base, tmp_path, client_home
):
    """The coordinator is SIGKILLed mid-job and restarted on its data directory: the job
    resumes from the checkpoint it wrote (one copy, on the coordinator), dials its servers
    again, and ends with the adapter of the same job run without interruption."""
    from tests.jobs.conftest import wait_for

    replicas = [
        start_daemon("serve", tmp_path / f"r{k}", "--device", "cpu", "--allow-any")
        for k in range(2)
    ]
    data_dir = tmp_path / "c"
    coordinator = start_daemon("serve", data_dir, "--device", "cpu", "--allow-any")
    spec = _spec(base, devices=[r.peer_id for r in replicas])
    spec.update(steps=40, checkpoint_every=5)
    try:
        for r in replicas:
            r.know(*[o for o in replicas if o is not r])
        coordinator.know(*replicas)  # kept in its data directory across the restart
        job = RemoteDevice(coordinator.target).jobs.submit(spec)
        wait_for(lambda: job.status()["checkpoint_step"] >= 10, timeout=120)
        coordinator.proc.kill()
        coordinator.proc.wait(10)
        coordinator = start_daemon("serve", data_dir, "--device", "cpu", "--allow-any")
        jobs = RemoteDevice(coordinator.target).jobs
        resumed = jobs.get(job.id)
        assert resumed.wait(timeout=180)["state"] == "succeeded"
        notes = [e.get("message", "") for e in resumed.events(0)]
        assert any("resumed from the checkpoint" in n for n in notes), notes
        again = jobs.submit(resumed.info["spec"])
        assert again.wait(timeout=180)["state"] == "succeeded"
        a = load_arrays(resumed.fetch(tmp_path / "a")[ADAPTER])
        b = load_arrays(again.fetch(tmp_path / "b")[ADAPTER])
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)  # bit for bit
    finally:
        for d in [coordinator, *replicas]:
            d.stop()


def test_a_server_killed_mid_job_is_dropped_and_the_job_ends_as_one_server(
    base, tmp_path, client_home
):
    """Three servers; devices[0] (rank 0: the coordinator's own model lives there) is
    SIGKILLed mid-job. The job logs which server it dropped and why, goes on with the two
    others from the last state they both hold, and ends with the adapter one server training
    on the whole batch makes. With require_all_devices the next loss fails the job instead,
    naming the server."""
    from tests.jobs.conftest import wait_for

    coordinator, replicas = _coordinator_and_replicas(tmp_path, 3)
    steps = 40
    try:
        jobs = RemoteDevice(coordinator.target).jobs
        a = _one_server_oracle(jobs, base, steps, tmp_path)
        parallel = jobs.submit(_spec(base, steps=steps, devices=[r.peer_id for r in replicas]))
        wait_for(lambda: parallel.status()["step"] >= 6, timeout=120)
        replicas[0].proc.kill()  # SIGKILL mid-job
        replicas[0].proc.wait(10)
        done = parallel.wait(timeout=240)
        notes = [e.get("message", "") for e in parallel.events(0)]
        assert done["state"] == "succeeded", (done, notes)
        print("\n".join(n for n in notes if n))  # what the job said (pytest -s)
        dropped = [n for n in notes if "dropped:" in n]
        assert len(dropped) == 1 and dropped[0].startswith("devices[0] ("), notes
        assert replicas[0].peer_id[:16] in dropped[0]
        assert any(n.startswith("continuing on 2 server(s) from step ") for n in notes), notes
        assert done["step"] == steps
        _assert_same_adapter(a, parallel, tmp_path)

        strict = jobs.submit(
            _spec(
                base,
                steps=steps,
                devices=[r.peer_id for r in replicas[1:]],
                require_all_devices=True,
            )  # fmt: skip
        )
        wait_for(lambda: strict.status()["step"] >= 3, timeout=120)
        replicas[2].proc.kill()
        with pytest.raises(JobError, match=r"lost devices\[1\] \(.*require_all_devices") as info:
            strict.wait(timeout=120)
        assert replicas[2].peer_id[:16] in str(info.value)
    finally:
        for d in [coordinator, *replicas]:
            d.stop()


def test_a_job_resumed_after_a_restart_goes_on_with_the_servers_it_can_still_reach(
    base, tmp_path, client_home
):
    """The coordinator and devices[1] are SIGKILLed; the coordinator restarts alone with its
    data directory: the job resumes from its checkpoint on devices[0] (logging the one it
    cannot reach) and ends as one server training on the whole batch."""
    from tests.jobs.conftest import wait_for

    data_dir = tmp_path / "c"
    coordinator, replicas = _coordinator_and_replicas(tmp_path, 2)
    steps = 30
    try:
        jobs = RemoteDevice(coordinator.target).jobs
        a = _one_server_oracle(jobs, base, steps, tmp_path)
        job = jobs.submit(_spec(base, steps=steps, devices=[r.peer_id for r in replicas]))
        wait_for(lambda: job.status()["checkpoint_step"] >= 8, timeout=120)
        for d in (coordinator, replicas[1]):
            d.proc.kill()
            d.proc.wait(10)
        coordinator = start_daemon("serve", data_dir, "--device", "cpu", "--allow-any")
        resumed = RemoteDevice(coordinator.target).jobs.get(job.id)
        done = resumed.wait(timeout=180)
        notes = [e.get("message", "") for e in resumed.events(0)]
        assert done["state"] == "succeeded", (done, notes)
        assert any(n.startswith("resumed from the checkpoint at step ") for n in notes), notes
        assert any(
            n.startswith(f"devices[1] ({replicas[1].peer_id[:16]}...) dropped: cannot reach")
            for n in notes
        ), notes
        assert "data-parallel on 1 servers" in notes, notes
        _assert_same_adapter(a, resumed, tmp_path)
    finally:
        for d in [coordinator, *replicas]:
            d.stop()
