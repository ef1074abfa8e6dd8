"""Faults across containers, made from the host while the runner trains (docker-compose only:
``make compose-test`` runs them; elsewhere they skip, saying so).

* a server paused (`docker pause`, every process frozen) for 10 s mid-training;
* a server taken off the network (`docker network disconnect`) for 10 s and put back;
* 10 % packet loss in a server's network namespace, each way (nftables ``numgen random``);
* a server killed (SIGKILL) and started again on the same volume mid-job (s3, which the
  host starts for this case).

Each run is compared bitwise with the same training on the local CPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from burn_remote import Device, RemoteDevice
from jobs.models import lora_spec, make_base
from remote.mlp import train

from .conftest import Lab
from .faults import Fault, fault_dir

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        fault_dir() is None, reason="faults across containers run under make compose-test"
    ),
]

STEPS = 8
FAULT_STEP = 2
"""The training step after which the fault starts."""


@pytest.fixture(scope="module")
def want() -> dict:
    """The oracle: the same training on this process's CPU."""
    return train(Device.cpu(), STEPS)


@pytest.fixture
def device(
    lab: Lab, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[Callable[[str], RemoteDevice]]:
    assert lab.relay is not None
    monkeypatch.setenv("BURN_REMOTE_RELAY", lab.relay.address)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("BURN_REMOTE_HOME", str(home))
    opened: list[RemoteDevice] = []

    def open_(node: str) -> RemoteDevice:
        """A device on a lab server by name, or on any server by peer id."""
        dev = RemoteDevice(lab.servers[node].peer_id if node in lab.servers else node)
        opened.append(dev)
        return dev

    yield open_
    for dev in opened:
        try:
            dev.close()
        except Exception:
            pass


def _equal(got: dict, want: dict) -> bool:
    return got["losses"] == want["losses"] and all(
        a.tobytes() == b.tobytes() for a, b in zip(got["weights"], want["weights"])
    )


def _train_across(dev: RemoteDevice, fault: dict) -> tuple[dict, dict]:
    """Train, starting the fault after FAULT_STEP; returns the result and the host's report."""
    made: list[Fault] = []

    def on_step(step: int, _: int) -> None:
        if step == FAULT_STEP:
            made.append(Fault(**fault))
            made[0].wait_started()

    got = train(dev, STEPS, on_step=on_step)
    return got, made[0].wait_done()


def test_paused_server_resumes_with_equal_weights(device, want) -> None:
    dev = device("s1")
    got, report = _train_across(dev, {"action": "pause", "service": "s1", "seconds": 10})
    assert report["paused_s"] >= 10
    assert _equal(got, want) and dev.stats()["errors"] == 0


def test_disconnected_server_survives_and_the_session_goes_on(device, want) -> None:
    """s2 is reached only through the relay: while it is off the network its relay
    registration refresh fails with ENETUNREACH (that used to end the server)."""
    dev = device("s2")
    got, report = _train_across(dev, {"action": "disconnect", "service": "s2", "seconds": 10})
    assert report["disconnected_s"] >= 10 and report["running"]
    assert _equal(got, want) and dev.stats()["errors"] == 0


def test_ten_percent_packet_loss_gives_bitwise_equal_training(device, want) -> None:
    clean = train(device("s1"), STEPS)
    Fault("loss", "s1", percent=10).wait_done()
    try:
        lossy = train(device("s1"), STEPS)
    finally:
        report = Fault("heal", "s1").wait_done()
    assert report["dropped"] > 0, report  # the rules did drop packets
    assert _equal(lossy, clean) and _equal(lossy, want)


def test_killed_server_restarted_on_its_volume_resumes_its_job(device, tmp_path: Path) -> None:
    """s3, started for this case (the compose run would end if a server it watches died)."""
    peer = Fault("start", "s3").wait_done()["peer_id"]
    base = make_base(tmp_path)
    # long enough that the host's kill (it polls for the request) lands mid-job
    spec = lora_spec(*base, steps=1000, checkpoint_every=5)
    first = device(peer)
    job = first.jobs.submit(spec)
    _wait(lambda: job.status()["checkpoint_step"] >= 5)
    first.close()  # a session does not outlive its server's process; the job does
    report = Fault("kill_restart", "s3").wait_done()
    assert report["restarted"]
    jobs = device(peer).jobs  # a new session with the restarted server
    resumed = jobs.get(job.id)
    assert resumed.wait(timeout=240)["state"] == "succeeded"
    notes = [e.get("message", "") for e in resumed.events(0)]
    assert any("resumed from the checkpoint" in n for n in notes), notes
    again = jobs.submit(resumed.info["spec"])  # the same job, uninterrupted
    assert again.wait(timeout=240)["state"] == "succeeded"
    a, b = resumed.fetch(tmp_path / "a"), again.fetch(tmp_path / "b")
    name = "adapter_model.safetensors"
    assert a[name].read_bytes() == b[name].read_bytes()


def _wait(predicate: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(0.1)
