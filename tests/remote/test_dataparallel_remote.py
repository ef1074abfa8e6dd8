"""DataParallel over real `burn-remote serve` processes on loopback: training on 2 and 3
servers equals one server on the whole batch, and a server killed mid-training fails the step
on every survivor with a GroupError naming it; the rebuilt group of the survivors continues
and still ends equal to one server."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from burn_remote import DataParallel, RemoteDevice, collective
from burn_remote.server.testing import Daemon
from support.dp_models import MODELS, assert_state_close, gpt2_small, mlp, train_one, train_parallel
from support.server_group import bounded, spawn_known

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WATCHDOG = 90.0
"""A hang fails the test instead of blocking the suite (not a timing assertion)."""


@pytest.fixture
def servers(tmp_path: Path, client_home: Path) -> Iterator[Callable[[int], list[Daemon]]]:
    """``servers(n)``: n CPU servers that know each other's addresses."""
    started: list[Daemon] = []
    yield lambda n: spawn_known(tmp_path, started, n, "--allow-any")
    for d in started:
        d.stop()


def _bounded(fn: Callable[[], object]) -> object:
    return bounded(fn, WATCHDOG)


@pytest.mark.parametrize(
    ("replicas", "kind"), [(2, "mlp"), (3, "mlp"), (2, "gpt_lora"), (3, "gpt_lora")]
)
def test_data_parallel_over_servers_equals_one_server_on_the_whole_batch(servers, replicas, kind):
    daemons = servers(replicas)
    devices = [RemoteDevice(d.target) for d in daemons]
    want, want_losses = train_one(devices[0], MODELS[kind], 12, 8)  # one server, whole batch
    got, losses, dp = _bounded(lambda: train_parallel(devices, MODELS[kind], 12, 8))
    assert_state_close(got, want)
    assert losses == pytest.approx(want_losses, rel=1e-5)
    digest = dp.check_in_sync()
    print(f"{replicas} servers, {kind}: in sync, digest {digest[:16]}")
    dp.close()


@pytest.mark.parametrize(("victim", "how"), [(2, "stop"), (0, "kill")])
def test_a_lost_server_fails_every_survivor_and_the_rebuilt_group_continues(servers, victim, how):
    """`stop`: the server freezes (SIGSTOP) while a step is under way: both survivors sit in
    the all-reduce until their links' heartbeats name it, so each raises a GroupError naming
    it (never a hang). `kill`: SIGKILL between steps: its own connection fails. Either way
    the rebuilt 2-replica group continues and ends equal to one server on the whole batches."""
    import signal

    batch, steps, fail_at = 12, 10, 4
    daemons = servers(3)
    devices = [RemoteDevice(d.target) for d in daemons]
    want, _ = train_one(devices[(victim + 1) % 3], mlp, batch, steps)
    model, opt, step, batches = mlp(batch, steps)
    dp = DataParallel(model, opt, devices=devices)
    run = dp.compile(step)
    for x, y in batches[:fail_at]:
        run(x, y)
    dp.sync()
    lost = daemons[victim].proc
    t0 = time.monotonic()
    try:
        if how == "stop":
            lost.send_signal(signal.SIGSTOP)
        else:
            lost.kill()
        with pytest.raises(collective.GroupError) as info:
            _bounded(lambda: [run(x, y) for x, y in batches[fail_at:]])
        noticed = time.monotonic() - t0
    finally:
        lost.kill()
    print(f"{how}: GroupError {noticed:.1f} s after the server was lost: {info.value}")
    assert info.value.rank == victim and daemons[victim].peer_id in str(info.value)
    failure = dp.last_failure
    assert failure is not None and failure.dead == {victim}
    if how == "stop":  # every survivor was in the all-reduce and names the same culprit
        for r in set(range(3)) - {victim}:
            err = failure.errors[r]
            assert isinstance(err, collective.GroupError) and err.rank == victim, err
    survivors = [d for k, d in enumerate(devices) if k != victim]
    assert dp.survivors() == survivors
    dp.rebuild()
    assert dp.devices == survivors and model.device is survivors[0]
    _bounded(lambda: [run(x, y) for x, y in batches[dp.steps :]])
    dp.check_in_sync()
    assert_state_close(dp.state_dict(), want)
    dp.close()


def test_a_group_is_set_up_on_a_server_a_tensor_was_just_moved_to(servers):
    """Regression: the session of a move's destination handles messages on an engine worker
    for a while; GroupSetup then used to fail (the ring's task was started off the loop).
    DataParallel always moves rank 0's model to the others first."""
    import numpy as np

    devices = [RemoteDevice(d.target) for d in servers(2)]
    moved = devices[0].tensor(np.arange(3, dtype=np.float32)).to(devices[1])
    with collective.Group(devices) as group:
        outs = [
            collective.all_reduce(d.tensor(np.ones(2, np.float32)), group, "sum") for d in devices
        ]
        assert outs[1].numpy().tolist() == [2.0, 2.0]
    assert moved.numpy().tolist() == [0.0, 1.0, 2.0]


def test_a_gpt2_small_sized_model_on_two_servers_equals_one_server(servers):
    """At the size users bring: two servers of one host (their ring through shared memory)
    train a 124M-parameter GPT, every parameter, as one server does on the whole batch."""
    daemons = servers(2)
    devices = [RemoteDevice(d.target) for d in daemons]
    want, want_losses = train_one(devices[0], gpt2_small, 2, 2)
    got, losses, dp = bounded(lambda: train_parallel(devices, gpt2_small, 2, 2), 600)
    for d in daemons:
        assert "through shared memory" in d.output(), d.output()
    assert_state_close(got, want)
    assert losses == pytest.approx(want_losses, rel=1e-5)
    dp.close()
