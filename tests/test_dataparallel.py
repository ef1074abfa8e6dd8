"""DataParallel on local replicas (`collective.local_devices`): training on shards equals one
device training on the whole batch, the replicas stay bit-identical, bad batches are refused
with the argument named, and a dead replica is reported and left behind by `rebuild`.

The same equalities through real servers are in tests/remote/test_dataparallel_remote.py and,
across network namespaces, tests/multinode/test_dataparallel_netns.py."""

from __future__ import annotations

import numpy as np
import pytest
from burn_remote import DataParallel, Device, ReplicaDivergence, ShardError, collective, nn, optim
from burn_remote import functional as F
from support.dp_models import (
    MODELS,
    assert_state_close,
    gpt_lora,
    mlp,
    mlp_step,
    train_one,
    train_parallel,
)

STEPS = 12
GROUP_TIMEOUT = 2.0
"""Seconds a local rank waits at the all-reduce for one that never comes (the fault tests).
Ranks that are still recording or computing are waited for regardless (see
tests/test_local_rendezvous.py, which runs at 0.5 s), so this only bounds the wait for a dead one."""


@pytest.mark.parametrize("replicas", [2, 3])
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_replicas_train_like_one_device_on_the_whole_batch(kind, replicas):
    want, want_losses = train_one(Device.cpu(), MODELS[kind], 12, STEPS)
    got, losses, dp = train_parallel(collective.local_devices(replicas), MODELS[kind], 12, STEPS)
    assert_state_close(got, want)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)  # the whole batch's mean loss
    dp.check_in_sync()
    first, _ = train_one(Device.cpu(), MODELS[kind], 12, 1)
    assert any(not np.array_equal(first[k], want[k]) for k in want)  # training moved weights
    dp.close()


def test_an_uneven_batch_is_weighted_by_shard_size():
    """47 samples over 3 replicas (16, 16, 15): still the whole batch's gradient."""
    want, want_losses = train_one(Device.cpu(), mlp, 47, 6)
    got, losses, dp = train_parallel(collective.local_devices(3), mlp, 47, 6)
    assert_state_close(got, want)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    dp.close()


def test_even_shards_refuses_an_uneven_batch_and_small_batches_are_refused():
    model, opt, step, batches = mlp(8, 1)
    dp = DataParallel(model, opt, devices=collective.local_devices(3), even_shards=True)
    run = dp.compile(step)
    x, y = batches[0]
    with pytest.raises(ShardError, match="8 samples does not split evenly across 3"):
        run(x, y)
    with pytest.raises(ShardError, match="batch of 2 samples cannot be split across 3"):
        run(x[:2], y[:2])
    with pytest.raises(ShardError, match=r"argument 1 has 7 samples .* argument 0 has 6"):
        run(x[:6], y[:7])
    with pytest.raises(ShardError, match="argument 0 is a burn_remote Tensor"):
        run(Device.cpu().tensor(x), y)
    with pytest.raises(ShardError, match="no batch to split"):
        run(1.0, 2.0)
    run(x[:6], y[:6])  # nothing above touched the replicas
    dp.check_in_sync()
    dp.close()


def test_state_dict_is_one_copy_and_replicas_are_identical():
    model, opt, step, batches = mlp(12, 3)
    devices = collective.local_devices(2)
    dp = DataParallel(model, opt, devices=devices)
    run = dp.compile(step)
    for x, y in batches:
        run(x, y)
    state = dp.state_dict()
    assert state.keys() == model.state_dict().keys()
    other = dp.replicas[1].model.state_dict()
    assert all(np.array_equal(state[k], other[k]) for k in state)
    assert model.device is devices[0] and dp.module is model and dp.optimizer is opt
    digest = dp.check_in_sync()
    assert len(digest) == 64 and digest == dp.check_in_sync()
    dp.close()


def test_check_in_sync_names_the_replica_and_tensor_that_diverged():
    model, opt, step, batches = mlp(12, 2)
    dp = DataParallel(model, opt, devices=collective.local_devices(3))
    run = dp.compile(step)
    for x, y in batches:
        run(x, y)
    rep = dp.replicas[2]
    bias = rep.model.get_submodule("2").bias
    bias._assign(rep.device.tensor(bias.numpy() + 1e-6))  # one replica silently off
    with pytest.raises(ReplicaDivergence, match=r"rank 2 .* 2\.bias differs") as info:
        dp.check_in_sync()
    assert info.value.rank == 2 and info.value.name == "2.bias"
    rep.optimizer.state[id(rep.model.get_submodule("0").weight)]["m"]._assign(
        rep.device.zeros((128, 64))
    )
    bias._assign(rep.device.tensor(model.get_submodule("2").bias.numpy()))
    with pytest.raises(ReplicaDivergence, match=r"optimizer\.0\.weight\.m differs"):
        dp.check_in_sync()
    dp.check_in_sync(optimizer=False)
    dp.close()


def test_an_lr_scheduler_on_rank_0_steers_every_replica():
    def build(batch, steps):
        model, opt, step, batches = mlp(batch, steps)
        return model, opt, step, batches

    model, opt, step, batches = build(12, 6)
    dp = DataParallel(model, opt, devices=collective.local_devices(2))
    sched = optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    run = dp.compile(step)
    for x, y in batches:
        run(x, y)
        sched.step()
    assert dp.replicas[1].optimizer.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    dp.check_in_sync()
    ref_model, ref_opt, _, _ = build(12, 6)
    ref_sched = optim.lr_scheduler.StepLR(ref_opt, step_size=1, gamma=0.5)
    dev = Device.cpu()
    ref_model.to(dev)
    for x, y in batches:
        mlp_step(ref_model, ref_opt, dev.tensor(x), dev.tensor(y))
        ref_sched.step()
    assert_state_close(dp.state_dict(), ref_model.state_dict())
    dp.close()


def test_gradient_accumulation_over_two_backward_calls_is_reduced_once_each():
    """Two half-batch backward calls per step: each contribution is averaged exactly once
    (a second reduction of the first half's gradient would double it under "sum")."""

    def two_halves(model, opt, x, y):
        h = x.shape[0] // 2
        (F.cross_entropy(model(x[:h]), y[:h]) * 0.5).backward()
        (F.cross_entropy(model(x[h:]), y[h:]) * 0.5).backward()
        opt.step()
        opt.zero_grad()

    for reduction in ("mean", "sum"):
        model, opt, _, batches = mlp(24, 4)
        dp = DataParallel(model, opt, devices=collective.local_devices(2), loss_reduction=reduction)
        run = dp.compile(two_halves)
        for x, y in batches:
            run(x, y)
        ref, ref_opt, _, _ = mlp(24, 4)
        dev = Device.cpu()
        ref.to(dev)
        for x, y in batches:
            parts = [(x[:6], y[:6]), (x[6:12], y[6:12]), (x[12:18], y[12:18]), (x[18:], y[18:])]
            if reduction == "mean":  # replicas' halves: (0-5, 6-11) and (12-17, 18-23)
                for px, py in parts:
                    (F.cross_entropy(ref(dev.tensor(px)), dev.tensor(py)) * 0.25).backward()
            else:  # sum: the replicas' losses add up
                for px, py in parts:
                    (F.cross_entropy(ref(dev.tensor(px)), dev.tensor(py)) * 0.5).backward()
            ref_opt.step()
            ref_opt.zero_grad()
        assert_state_close(dp.state_dict(), ref.state_dict())
        dp.close()


def test_eval_mode_and_freezing_on_rank_0_reach_every_replica():
    model, opt, step, batches = mlp(12, 2)
    dp = DataParallel(model, opt, devices=collective.local_devices(2))
    run = dp.compile(step)
    model.eval()
    model.get_submodule("0").weight.requires_grad_(False)
    run(*batches[0])
    rep = dp.replicas[1].model
    assert not rep.training and not rep.get_submodule("0").weight.requires_grad
    dp.check_in_sync()
    dp.close()


def test_results_come_back_combined_and_non_float_results_are_refused():
    model, opt, _, batches = mlp(12, 2)
    dp = DataParallel(model, opt, devices=collective.local_devices(3))

    def with_metrics(model, opt, x, y):
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        acc = (logits.argmax(-1) == y).float().mean()
        return {"loss": loss, "acc": acc}

    x, y = batches[0]
    out = dp.compile(with_metrics)(x, y)
    dev = Device.cpu()
    ref, _, _, _ = mlp(12, 2)
    ref.to(dev)
    logits = ref(dev.tensor(x))
    want_acc = float((logits.argmax(-1) == dev.tensor(y)).float().mean().item())
    assert abs(float(out["acc"].item()) - want_acc) < 1e-6
    want_loss = float(F.cross_entropy(logits, dev.tensor(y)).item())
    assert abs(float(out["loss"].item()) - want_loss) < 1e-5

    def returns_ints(model, opt, x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return (model(x).argmax(-1) == y).sum()

    with pytest.raises(TypeError, match="returns a int64 tensor"):
        dp.compile(returns_ints)(x, y)
    dp.close()


def test_bad_arguments_are_refused_before_anything_is_copied():
    model, opt, _, _ = mlp(12, 1)
    devices = collective.local_devices(2)
    with pytest.raises(ValueError, match=r"devices\[0\] and devices\[1\] are the same device"):
        DataParallel(model, opt, devices=[devices[0], devices[0]])
    with pytest.raises(ValueError, match="at least one device"):
        DataParallel(model, opt, devices=[])
    with pytest.raises(ValueError, match="loss_reduction"):
        DataParallel(model, opt, devices=devices, loss_reduction="max")
    stranger = optim.SGD([nn.Linear(2, 2).weight], lr=0.1)
    with pytest.raises(ValueError, match="not a parameter of the model"):
        DataParallel(model, stranger, devices=devices)


def _three_replicas(make, batch: int, steps: int, warm: int):
    """``make``'s model trained on one CPU device (the oracle), and the same model data-parallel
    on three local replicas that ran its first ``warm`` batches: (want, model, devices, dp,
    run, batches)."""
    want, _ = train_one(Device.cpu(), make, batch, steps)
    model, opt, step, batches = make(batch, steps)
    devices = collective.local_devices(3)
    dp = DataParallel(model, opt, devices=devices, group_timeout=GROUP_TIMEOUT)
    run = dp.compile(step)
    for x, y in batches[:warm]:
        run(x, y)
    return want, model, devices, dp, run, batches


def _kill(device) -> None:
    """The replica stops running anything it is given: its rank never reaches the next
    all-reduce (what a dead server looks like to the survivors)."""
    device._rec.runtime.execute = lambda capture: None


@pytest.mark.parametrize("victim", [2, 0])
def test_a_dead_replica_fails_every_survivor_and_a_rebuilt_group_continues(victim):
    """The survivors' step fails with a GroupError naming the dead rank; rebuild continues
    from the last good state, and re-running the lost step gives exactly the training one
    device does on the whole batches. Rank 0 dying moves the user's model to the new rank 0."""
    batch, steps, fail_at = 12, 8, 4
    want, model, devices, dp, run, batches = _three_replicas(mlp, batch, steps, fail_at)
    _kill(devices[victim])
    run(*batches[fail_at])  # the survivors wait at the all-reduce for the dead rank
    with pytest.raises(collective.GroupError) as info:
        run(*batches[fail_at + 1])
    assert info.value.rank == victim and f"local:{victim}" in str(info.value)
    assert "dp.rebuild()" in "".join(getattr(info.value, "__notes__", []))
    assert dp.last_failure is not None and dp.last_failure.dead == {victim}
    for r in set(range(3)) - {victim}:  # every survivor saw the same error
        assert dp.last_failure.errors[r].rank == victim
    with pytest.raises(RuntimeError, match="call dp.rebuild"):
        run(*batches[fail_at])
    survivors = [d for k, d in enumerate(devices) if k != victim]
    assert dp.survivors() == survivors
    dp.rebuild()
    assert dp.devices == survivors and dp.steps == fail_at
    assert dp.module is model and model.device is survivors[0]
    for x, y in batches[dp.steps :]:
        run(x, y)
    dp.check_in_sync()
    assert_state_close(dp.state_dict(), want)
    dp.close()


def test_rank_0_of_a_gpt_dying_moves_every_tensor_of_your_model_to_the_new_rank_0():
    """The user's model objects take the new rank 0's tensors, non-persistent buffers (the
    GPT's causal mask) included: the next step records on one device only."""
    want, model, devices, dp, run, batches = _three_replicas(gpt_lora, 6, 5, 2)
    _kill(devices[0])
    run(*batches[2])
    with pytest.raises(collective.GroupError):
        run(*batches[3])
    dp.rebuild()
    assert dp.steps == 2 and model.device is devices[1]
    assert all(t.device is devices[1] for _, t in model._named(("_buffers",), False))
    for x, y in batches[dp.steps :]:
        run(x, y)
    assert_state_close(dp.state_dict(), want)
    dp.close()


def test_rebuild_refuses_a_device_that_was_not_a_replica():
    model, opt, _, _ = mlp(12, 1)
    dp = DataParallel(model, opt, devices=collective.local_devices(2))
    with pytest.raises(ValueError, match="is not a replica of this DataParallel"):
        dp.rebuild(collective.local_devices(1))
    dp.close()


def test_an_error_inside_the_step_leaves_the_replicas_as_they_were():
    """The user's step raising halfway (after backward recorded an all-reduce on rank 0)
    must not leave an all-reduce waiting for partners: the replicas go back to the step's
    start and the next call trains as if the failed one never happened."""
    want, _ = train_one(Device.cpu(), mlp, 12, 3)
    model, opt, step, batches = mlp(12, 3)
    dp = DataParallel(model, opt, devices=collective.local_devices(2), group_timeout=30.0)
    broken = [False]

    def flaky(model, opt, x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        if broken[0]:
            raise KeyError("a bug in the step")
        opt.step()
        opt.zero_grad()
        return loss

    run = dp.compile(flaky)
    run(*batches[0])
    broken[0] = True
    with pytest.raises(KeyError, match="a bug in the step"):
        run(*batches[1])
    broken[0] = False
    for x, y in batches[1:]:
        run(x, y)
    dp.check_in_sync()
    assert_state_close(dp.state_dict(), want)
    dp.close()


def test_without_snapshots_rebuild_needs_a_state_to_continue_from():
    model, opt, step, batches = mlp(12, 4)
    devices = collective.local_devices(3)
    dp = DataParallel(model, opt, devices=devices, snapshot_every=None, group_timeout=GROUP_TIMEOUT)
    run = dp.compile(step)
    run(*batches[0])
    good = dp.state_dict(), dp.optimizer_state_dict()
    _kill(devices[1])
    run(*batches[1])
    with pytest.raises(collective.GroupError):
        dp.sync()
    with pytest.raises(RuntimeError, match="no good state is held"):
        dp.rebuild()
    dp.rebuild([devices[0], devices[2]])
    with pytest.raises(RuntimeError, match="load one with dp.load_state_dict"):
        run(*batches[1])
    dp.load_state_dict(*good)
    for x, y in batches[1:]:
        run(x, y)
    dp.check_in_sync()
    want, _ = train_one(Device.cpu(), mlp, 12, 4)
    assert_state_close(dp.state_dict(), want)
    dp.close()


def test_one_device_is_plain_captured_training_bit_for_bit():
    want, _ = train_one(Device.cpu(), mlp, 12, 5)
    got, _, dp = train_parallel([Device.cpu()], mlp, 12, 5)
    assert all(np.array_equal(got[k], want[k]) for k in want)


@pytest.mark.slow
def test_gpt2_small_sized_lora_on_two_replicas_equals_one_device():
    """At the size users bring (124M parameters, ~500 MB per replica): replication, the
    bucketed all-reduce of the adapters' gradients and the digest over every tensor."""
    import gc

    import burn_remote as br

    cfg = nn.GPTConfig(n_layer=12, n_head=12, d_model=768, vocab=50257, context=8)
    ids = np.random.default_rng(6).integers(0, cfg.vocab, (2, 2, cfg.context + 1))

    def build():
        nn.seed(5)
        model = br.lora.apply_lora(
            nn.GPT(cfg), br.lora.LoraConfig(r=4, alpha=8, target_modules=["c_attn"])
        )
        return model, optim.AdamW(model, lr=1e-3)

    def step(model, opt, x, y):
        loss = model.loss(x, y)
        loss.backward()
        optim.clip_grad_norm(model, 1.0)
        opt.step()
        opt.zero_grad()
        return loss

    model, opt = build()
    dev = Device.cpu()
    for s in ids:
        step(model, opt, dev.tensor(s[:, :-1]), dev.tensor(s[:, 1:]))
    want = {n: t.numpy() for n, t in model.named_parameters() if ".lora_" in n}
    del model, opt
    gc.collect()
    model, opt = build()
    dp = DataParallel(model, opt, devices=collective.local_devices(2))
    run = dp.compile(step)
    for s in ids:
        run(s[:, :-1], s[:, 1:])
    got = {n: t.numpy() for n, t in model.named_parameters() if ".lora_" in n}
    assert_state_close(got, want)
    assert len(dp.check_in_sync()) == 64
    dp.close()


def test_a_replica_that_hangs_between_steps_is_named_by_a_probe_not_waited_for():
    """A rank that stops answering while the group is idle (its worker frozen: no error, no
    answer) is not waited for: after PROBE_AFTER the group is probed with a tiny all-reduce,
    which fails on every survivor naming it; rebuild continues without it."""
    import threading

    want, model, devices, dp, run, batches = _three_replicas(mlp, 12, 6, 3)
    dp.sync()
    thaw = threading.Event()
    devices[1]._rec.runtime._queue.put(lambda: thaw.wait(120))  # rank 1 hangs
    try:
        with pytest.raises(collective.GroupError) as info:
            run(*batches[3])
        assert info.value.rank == 1
        assert dp.last_failure.dead == {1}
        assert {r: e.rank for r, e in dp.last_failure.errors.items()} == {0: 1, 2: 1}
        dp.rebuild()
        assert dp.steps == 3 and dp.devices == [devices[0], devices[2]]
        for x, y in batches[3:]:
            run(x, y)
        dp.check_in_sync()
        assert_state_close(dp.state_dict(), want)
    finally:
        thaw.set()
        dp.close()


def test_batchnorm_running_statistics_are_rank_0s_on_every_replica():
    """As PyTorch DDP's broadcast_buffers: each replica normalises its shard with the shard's
    statistics, and the running statistics every replica keeps are rank 0's."""

    def build(batch, steps):
        nn.seed(7)
        net = nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10))
        opt = optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        _, _, step, batches = mlp(batch, steps)
        return net, opt, step, batches

    model, opt, step, batches = build(12, 4)
    dp = DataParallel(model, opt, devices=collective.local_devices(3))
    run = dp.compile(step)
    for x, y in batches:
        run(x, y)
    dp.check_in_sync()  # running_mean/var and num_batches_tracked included
    bn = model.get_submodule("1")
    assert int(bn.num_batches_tracked.item()) == 4
    assert np.abs(bn.running_mean.numpy()).max() > 0
    # rank 0's statistics: its first shard (4 samples) alone, through the same first layer
    ref, _, _, _ = build(12, 4)
    x0 = batches[0][0][:4]
    h = ref.get_submodule("0")(Device.cpu().tensor(x0)).numpy()
    first = 0.1 * h.mean(0)  # momentum 0.1 from zeros after one step
    dp2 = DataParallel(*build(12, 1)[:2], devices=collective.local_devices(3))
    dp2.compile(step)(*batches[0])
    np.testing.assert_allclose(
        dp2.replicas[2].model.get_submodule("1").running_mean.numpy(), first, rtol=1e-5, atol=1e-6
    )
    dp.close()
    dp2.close()


def test_waiting_for_the_replicas_touches_each_recorder_from_the_calling_thread_only(
    monkeypatch,
):
    """DataParallel waits for every replica at once, one thread each. Those threads must not
    flush: a partner's `sync` flushes the other ranks too, so two threads once captured one
    rank's pending ops together and lost its tensors ("tensor 2 was never computed", the
    GPT-2-small-sized test's failure under load)."""
    import threading

    from burn_remote._recorder import Recorder

    model, opt, step, batches = mlp(12, 3)
    devices = collective.local_devices(3)
    dp = DataParallel(model, opt, devices=devices, group_timeout=GROUP_TIMEOUT)
    run = dp.compile(step)
    run(*batches[0])
    callers: set[str] = set()
    flush = Recorder.flush

    def watched(self):
        if self.pending:
            callers.add(threading.current_thread().name)
        return flush(self)

    monkeypatch.setattr(Recorder, "flush", watched)
    for x, y in batches[1:]:
        run(x, y)
        for d in devices:  # something pending on every rank when the wait starts
            d.zeros((2,))
        dp.sync()
    assert callers == {threading.current_thread().name}, callers
    dp.close()


def test_a_replica_whose_step_fails_is_named_at_once_with_its_own_error():
    """Rank 1's step fails before its all-reduce (memory runs out): rank 0 does not wait
    the group's 60 s for it; the error names rank 1 and carries rank 1's own failure."""

    model, opt, step, batches = mlp(12, 3)
    devices = collective.local_devices(2)
    dp = DataParallel(model, opt, devices=devices, group_timeout=60.0)
    run = dp.compile(step)
    run(*batches[0])
    dp.sync()
    runtime = devices[1]._rec.runtime

    def out_of_memory():
        raise MemoryError("Unable to allocate 3.00 GiB for an array")

    runtime.execute = lambda capture: runtime._put(out_of_memory)
    run(*batches[1])
    with pytest.raises(collective.GroupError) as info:
        dp.sync()
    assert "no progress" not in str(info.value)  # it did not wait out the group timeout
    assert info.value.rank == 1 and dp.last_failure.dead == {1}
    notes = "".join(getattr(info.value, "__notes__", []))
    assert "rank 1 (ReplicaDevice('cpu', 1)) itself failed with MemoryError: Unable" in notes
    dp.close()
