"""br.compile: a captured step replays bit for bit what the plain step computes, re-captures
on a guard miss, refuses what it cannot replay with the user's line, and holds its memory."""

from __future__ import annotations

import gc
import logging
import pathlib
import re

import burn_remote as br
import numpy as np
import pytest
from burn_remote import functional as F
from burn_remote import nn, optim
from conftest import _UNAVAILABLE
from support import replay_memory
from support.capture_models import MODELS, gpt_lora, train
from support.capture_models import same_state as _same

DEV = br.Device.cpu()


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_captured_training_equals_plain_training_bitwise(kind):
    plain = train(DEV, MODELS[kind], 100, compiled=False)
    captured = train(DEV, MODELS[kind], 100, compiled=True)
    stats = captured["__stats__"]
    assert stats["replays"] >= 95 and stats["captures"] == 1, stats
    _same(plain, captured)
    first = train(DEV, MODELS[kind], 1, compiled=False)  # training moved the weights at all
    assert any(not np.array_equal(first[k], plain[k]) for k in plain)


def test_a_lambda_schedule_and_parameter_groups_replay_exactly():
    def build(dev):
        nn.seed(3)
        net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        opt = optim.Adam(
            net,
            lr=1e-2,
            groups=[optim.ParamGroup("0.*", lr=3e-2, weight_decay=0.1)],
            schedule=lambda s: 0.5 ** (s // 7),
        )

        def step(x, y):
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        return net, step, lambda i: _batch(8, i)

    _same(train(DEV, build, 30, compiled=False), train(DEV, build, 30, compiled=True))


def test_in_place_ops_inside_a_step_replay_exactly():
    """A residual block written as torch users do (`out += identity`, `relu_`-style rebinds)
    and a running average kept in place under no_grad."""

    def build(dev):
        nn.seed(4)
        a, b = nn.Linear(8, 8), nn.Linear(8, 3)
        opt = optim.AdamW([*a.parameters(), *b.parameters()], lr=1e-2)
        avg = dev.zeros(())

        def step(x, y):
            h = a(x)
            h += x  # in place on a tensor that tracks gradients
            loss = F.cross_entropy(b(h.relu()), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            with br.no_grad():
                avg.mul_(0.9).add_(loss.detach() * 0.1)
            return loss

        class Net(nn.Module):
            def __init__(self):
                self.a, self.b, self.avg = a, b, avg

        return Net(), step, lambda i: _batch(8, i)

    _same(train(DEV, build, 30, compiled=False), train(DEV, build, 30, compiled=True))


def test_qlora_step_captures_and_matches():
    build = lambda dev: gpt_lora(dev, quantize="nf4")  # noqa: E731
    _same(train(DEV, build, 30, compiled=False), train(DEV, build, 30, compiled=True))


def _mlp():
    nn.seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = optim.Adam(net.parameters(), lr=1e-2)

    def step(x, y):
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return net, opt, step


def _batch(n, seed):
    rng = np.random.default_rng(seed)
    return DEV.tensor(rng.standard_normal((n, 8)).astype(np.float32)), DEV.tensor(
        rng.integers(0, 3, n)
    )


def test_guard_miss_on_a_new_batch_shape_recaptures_and_stays_correct(caplog):
    sizes = [8, 8, 8, 8, 5, 8, 5, 5, 5, 8, 5, 8]
    net_a, _, plain = _mlp()
    for i, n in enumerate(sizes):
        plain(*_batch(n, i))
        DEV.flush()
    net_b, _, step = _mlp()
    compiled = br.compile(step)
    with caplog.at_level(logging.DEBUG, logger="burn_remote.compile"):
        for i, n in enumerate(sizes):
            loss = compiled(*_batch(n, i))
    assert loss.shape == ()
    assert compiled.stats()["captures"] == 2 and compiled.stats()["replays"] >= 4
    assert any("shape (5, 8), captured with (8, 8)" in r.getMessage() for r in caplog.records)
    assert "shape (5, 8)" in compiled.retraces[0]
    for a, b in zip(net_a.parameters(), net_b.parameters()):
        assert np.array_equal(a.numpy(), b.numpy())


def test_a_repeated_call_is_checked_leaf_by_leaf_before_it_replays():
    """A call with the last call's signature takes a shorter guard (``_invoke``): each
    argument's shape, dtype and device, no tensor passed twice, the grad mode. Any change
    still captures again, and going back replays the first capture with the new values."""

    @br.compile
    def f(a, b):
        return a * 2 + b

    x = DEV.tensor(np.arange(4, dtype=np.float32))
    y = DEV.tensor(np.ones(4, np.float32))
    for _ in range(4):
        np.testing.assert_array_equal(f(x, y).numpy(), np.arange(4) * 2 + 1)
    assert f.stats() == {"recordings": 2, "replays": 2, "captures": 1}
    calls = [
        ((x, x), np.arange(4) * 3, "same tensor as another"),
        ((x, DEV.tensor(np.ones(4, np.float64))), np.arange(4) * 2 + 1, "dtype float64"),
        ((DEV.tensor(np.ones(4, np.int64)), y), np.full(4, 3.0), "dtype int64"),
        ((x[:3], y[:3]), np.arange(3) * 2 + 1, "shape (3,)"),
    ]
    for args, want, why in calls:
        before = f.stats()["recordings"]
        np.testing.assert_array_equal(f(*args).numpy(), want)
        assert f.stats()["recordings"] == before + 1, why
        assert why in f.retraces[-1], (why, f.retraces[-1])
    with br.no_grad():
        before = f.stats()["recordings"]
        f(x, y)
        assert f.stats()["recordings"] == before + 1
    replays = f.stats()["replays"]
    z = DEV.tensor(np.full(4, 5, np.float32))
    for k in (1, 2):  # the first capture again, then the same signature as the last call
        np.testing.assert_array_equal(f(z, y).numpy(), np.full(4, 11.0))
        assert f.stats()["replays"] == replays + k


def test_python_numbers_are_bindings_not_retraces():
    w = DEV.tensor(np.ones(4, np.float32))

    @br.compile
    def scaled(x, a, k):
        return x * a + k

    x = DEV.tensor(np.arange(4, dtype=np.float32))
    for i in range(8):
        out = scaled(x, 0.5 * i, i)
        np.testing.assert_array_equal(out.numpy(), np.arange(4) * np.float32(0.5 * i) + i)
    assert scaled.stats() == {"recordings": 2, "replays": 6, "captures": 1}
    assert w.numpy().sum() == 4


def test_a_compiled_method_keeps_captures_per_instance():
    class Trainer:
        def __init__(self, seed):
            nn.seed(seed)
            self.net = nn.Linear(4, 2)
            self.opt = optim.SGD(self.net.parameters(), lr=0.1)

        @br.compile
        def step(self, x):
            loss = (self.net(x) ** 2).mean()
            loss.backward()
            self.opt.step()
            self.opt.zero_grad()
            return loss

    a, b = Trainer(0), Trainer(1)
    x = DEV.tensor(np.ones((3, 4), np.float32))
    for _ in range(5):
        a.step(x), b.step(x)
    ref = Trainer(1)
    for _ in range(5):
        loss = (ref.net(x) ** 2).mean()
        loss.backward()
        ref.opt.step()
        ref.opt.zero_grad()
        DEV.flush()
    assert np.array_equal(b.net.weight.numpy(), ref.net.weight.numpy())
    assert not np.array_equal(a.net.weight.numpy(), b.net.weight.numpy())
    assert Trainer.step.stats()["captures"] == 2 and Trainer.step.stats()["replays"] == 4


def test_containers_and_named_tuples_as_arguments():
    from typing import NamedTuple

    class Batch(NamedTuple):
        x: br.Tensor
        scale: float

    @br.compile
    def f(batch, extra, opts):
        return {"y": batch.x * batch.scale + extra[0], "z": (opts["w"] * 2,)}

    x, w = DEV.tensor(np.ones(2, np.float32)), DEV.tensor(np.full(2, 3.0, np.float32))
    for i in range(5):
        out = f(Batch(x, float(i)), [np.float32(1.0)], {"w": w})
        assert out["y"].numpy().tolist() == [i + 1.0] * 2
        assert out["z"][0].numpy().tolist() == [6.0, 6.0]
    assert f.stats()["replays"] == 3


def test_bools_and_strings_are_part_of_the_guard():
    @br.compile
    def act(x, kind, neg):
        y = x.relu() if kind == "relu" else x.tanh()
        return -y if neg else y

    x = DEV.tensor(np.array([-1.0, 2.0], np.float32))
    for _ in range(4):
        np.testing.assert_allclose(act(x, "relu", False).numpy(), [0, 2])
        np.testing.assert_allclose(act(x, "tanh", True).numpy(), -np.tanh([-1.0, 2.0]), 1e-6)
    assert act.stats()["captures"] == 2


def test_state_replaced_outside_is_read_on_the_next_replay():
    net, opt, step = _mlp()
    compiled = br.compile(step)
    for i in range(5):
        compiled(*_batch(8, i))
    w = net[0].weight
    w._assign(DEV.tensor(np.zeros(w.shape, np.float32)))  # load_state_dict does this
    compiled(*_batch(8, 9))
    assert compiled.stats()["replays"] == 3
    # the replay read the zeros: the update moved them by about lr at most
    assert np.abs(w.numpy()).max() <= 0.011


def test_a_replay_updates_state_in_place_as_autograd_sees_it():
    net, _, step = _mlp()
    compiled = br.compile(step)
    for i in range(4):
        compiled(*_batch(8, i))
    x, y = _batch(8, 0)
    loss = F.cross_entropy(net(x), y)  # the tape saves the weights
    compiled(*_batch(8, 1))  # a replay updates them, as opt.step() would
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        loss.backward()


def _state(net, opt):
    moments = [t for slots in opt.state.values() for t in slots.values()]
    return [net[0].weight, net[0].bias, net[2].weight, net[2].bias, *moments]


def test_replays_write_state_in_place_under_the_ids_it_holds():
    """A replay stores the new parameters and moments under the ids their tensors already
    hold (no rebinding per step), and computes what the plain step computes."""
    net, opt, step = _mlp()
    compiled = br.compile(step)
    for i in range(4):
        compiled(*_batch(8, i))
    ids = [t._id for t in _state(net, opt)]
    versions = [t._version for t in _state(net, opt)]
    before = net[0].weight.numpy().copy()
    for i in range(4, 9):
        compiled(*_batch(8, i))
    assert [t._id for t in _state(net, opt)] == ids
    assert [t._version for t in _state(net, opt)] == [v + 5 for v in versions]
    assert not np.array_equal(net[0].weight.numpy(), before)  # it did train
    assert compiled.stats()["replays"] == 6  # the calls above after three recordings

    plain_net, plain_opt, plain_step = _mlp()
    for i in range(9):
        plain_step(*_batch(8, i))
    for a, b in zip(_state(net, opt), _state(plain_net, plain_opt)):
        assert np.array_equal(a.numpy(), b.numpy())


def test_an_alias_of_updated_state_keeps_its_value_as_without_capture():
    """`detach()` of a parameter taken between steps holds the value it had, with and
    without capture (the replay gives the parameter a new id instead of writing the shared
    one); once the alias is gone, replays write in place again."""
    runs = {}
    for compiled_step in (False, True):
        net, opt, step = _mlp()
        fn = br.compile(step) if compiled_step else step
        for i in range(4):
            fn(*_batch(8, i))
        alias = net[0].weight.detach()
        kept = alias.numpy().copy()
        fn(*_batch(8, 4))
        assert np.array_equal(alias.numpy(), kept)
        assert not np.array_equal(net[0].weight.numpy(), kept)
        del alias
        ids = [t._id for t in _state(net, opt)]
        fn(*_batch(8, 5))
        if compiled_step:
            assert [t._id for t in _state(net, opt)] == ids
        runs[compiled_step] = [t.numpy() for t in _state(net, opt)]
    for a, b in zip(runs[False], runs[True]):
        assert np.array_equal(a, b)


def test_ops_recorded_before_a_replay_read_the_state_as_it_was():
    """Pending ops that read a parameter run before the replay that updates it (a replay
    used to free the old value first: 'an input of this graph is unavailable')."""
    net, opt, step = _mlp()
    compiled = br.compile(step)
    for i in range(4):
        compiled(*_batch(8, i))
    kept = net[0].weight.numpy().copy()
    doubled = net[0].weight * 2.0  # pending, not run yet
    compiled(*_batch(8, 4))
    assert np.array_equal(doubled.numpy(), kept * 2.0)


def test_a_step_returning_a_parameter_it_updates_returns_that_parameter():
    """`return loss, net.weight`: the call returns the parameter object itself, updated by
    every replay as the plain step updates it (replays used to return a fresh tensor and
    leave the parameter behind: training silently diverged from the plain step)."""
    runs = {}
    for compiled_step in (False, True):
        net, opt, step = _mlp()

        def step_and_weight(x, y, step=step, net=net):
            return step(x, y).detach(), net[0].weight

        fn = br.compile(step_and_weight) if compiled_step else step_and_weight
        for i in range(8):
            loss, w = fn(*_batch(8, i))
            assert w is net[0].weight
        runs[compiled_step] = [t.numpy() for t in _state(net, opt)] + [loss.numpy()]
    assert fn.stats()["replays"] >= 4
    for a, b in zip(runs[False], runs[True]):
        assert np.array_equal(a, b)


def _loopback():
    from burn_remote.server._loopback import loopback_device

    return loopback_device()[0]


@pytest.mark.parametrize("where", ["cpu", "loopback"])
def test_a_step_failing_midway_leaves_no_half_updated_state(where):
    """A replay that fails after its optimizer update ran (an index out of range, found only
    when the graph runs): every state tensor it writes then fails to read, naming the op
    and line (none holds a half-updated value); a plain step fails the same way, and new
    state can be loaded and trained again."""
    dev = DEV if where == "cpu" else _loopback()
    nn.seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).to(dev)
    opt = optim.AdamW(net.parameters(), lr=1e-2)
    table = dev.tensor(np.arange(4, dtype=np.float32))
    rng = np.random.default_rng(0)
    x = dev.tensor(rng.standard_normal((8, 8)).astype(np.float32))
    y = dev.tensor(rng.integers(0, 3, 8))

    @br.compile
    def step(x, y, idx):
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach() + table[idx].sum()  # recorded after the update: fails after it

    good, bad = dev.tensor(np.array([1, 2])), dev.tensor(np.array([1, 9]))
    for _ in range(5):
        step(x, y, good)
    assert step.stats()["replays"] == 2  # after three recordings (Adam's first step differs)
    ids = [t._id for t in _state(net, opt)]
    with pytest.raises(br.OpFailed, match=r"recorded at .*test_compile.py:\d+"):
        step(x, y, bad).item()
    assert [t._id for t in _state(net, opt)] == ids  # written in place (then lost)
    gone = "index_select" if where == "cpu" else "was not made: the step that makes it failed"
    for t in _state(net, opt):
        with pytest.raises(br.OpFailed, match=gone):
            t.numpy()
    with pytest.raises(br.OpFailed, match="index_select|unavailable|was not made"):
        step(x, y, good).item()  # the step needs the lost state
    # load state again (as from a checkpoint): training goes on, capturing again
    nn.seed(1)
    fresh = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).to(dev)
    for p, q in zip(net.parameters(), fresh.parameters()):
        p._assign(q)
    opt.state.clear()
    for _ in range(3):
        loss = step(x, y, good)
    assert np.isfinite(loss.item())
    assert all(np.isfinite(t.numpy()).all() for t in _state(net, opt))


def test_an_alias_of_frozen_state_does_not_hide_its_replacement():
    nn.seed(0)
    lin = nn.Linear(4, 2)
    lin.weight.requires_grad_(False)
    alias = lin.weight.detach()  # the user keeps the old value around
    f = br.compile(lambda x: lin(x).detach())
    x = DEV.tensor(np.ones((1, 4), np.float32))
    for _ in range(4):
        f(x)
    lin.weight._assign(DEV.tensor(np.zeros((2, 4), np.float32)))  # load_state_dict does this
    out = f(x).numpy()
    np.testing.assert_allclose(out, lin.bias.numpy()[None], rtol=1e-6)
    assert alias.numpy().any()


def test_train_eval_switch_recaptures():
    nn.seed(0)
    drop = nn.Dropout(0.5)

    @br.compile
    def f(x):
        return drop(x) * 1.0

    x = DEV.tensor(np.ones((4, 64), np.float32))
    for _ in range(4):
        masked = f(x).numpy()
    assert (masked == 0).any()
    drop.eval()
    for _ in range(4):
        assert np.array_equal(f(x).numpy(), np.ones((4, 64)))
    drop.train()
    draws = [f(x).numpy() for _ in range(4)]
    assert not np.array_equal(draws[-1], draws[-2])  # a fresh key per replayed call


def _raises(fn, *args, pattern):
    with pytest.raises(br.CaptureError, match=pattern) as info:
        fn(*args)
    return str(info.value)


def test_reading_a_value_inside_fails_with_the_line():
    x = DEV.tensor(np.ones(3, np.float32))

    @br.compile
    def with_item(x):
        y = (x * 2).sum()
        print(y.item())  # the offending line
        return y

    @br.compile
    def with_numpy(x):
        return DEV.tensor(x.numpy() * 2)

    @br.compile
    def with_branch(x):
        y = x.sum()
        if y > 0:
            return y
        return -y

    @br.compile
    def with_print(x):
        y = x * 3
        print("y is", y)
        return y

    @br.compile
    def with_format(x):
        y = x.sum()
        print(f"y is {y:.3f}")
        return y

    @br.compile
    def with_sync(x):
        y = x + 1
        DEV.sync()
        return y

    msg = _raises(with_item, x, pattern=r"item\(\) on a tensor at .*test_compile.py:\d+")
    line = int(re.search(r"test_compile.py:(\d+)", msg).group(1))
    src = pathlib.Path(__file__).read_text().splitlines()[line - 1]
    assert "the offending line" in src
    _raises(with_numpy, x, pattern=r"numpy\(\) on a tensor")
    _raises(with_branch, x, pattern=r"Python branch on a tensor value")
    _raises(with_sync, x, pattern=r"sync")
    _raises(with_print, x, pattern=r"printing a tensor's value")
    _raises(with_format, x, pattern=r"printing a tensor's value")
    assert (x + 1).numpy().tolist() == [2, 2, 2]  # the device still works after the errors


def test_unsupported_arguments_and_results_are_refused():
    x = DEV.tensor(np.ones(3, np.float32))
    f = br.compile(lambda a: a * 2)
    msg = _raises(f, np.ones(3), pattern=r"argument\[0\] is a ndarray.*dev.tensor")
    assert re.search(r"called at .*test_compile.py:\d+", msg)  # the line that called it
    _raises(f, object(), pattern=r"argument\[0\] is a object")
    g = br.compile(lambda a: (a * 2, 3.5))
    _raises(g, x, pattern=r"returns a Python float")
    nn.seed(0)
    lin = nn.Linear(3, 2)
    h = br.compile(lambda a: lin(a))
    _raises(h, x, pattern=r"still on the autograd tape")
    k = br.compile(lambda: 1)
    _raises(k, pattern=r"got no tensor argument")


def test_changing_python_state_inside_is_refused():
    box = {"n": 0}
    x = DEV.tensor(np.ones(3, np.float32))

    @br.compile
    def drifting(x):
        box["n"] += 1
        return x * DEV.scalar(box["n"])

    msg = _raises(lambda: [drifting(x) for _ in range(6)], pattern=r"recorded a different step")
    assert "dev.scalar" in msg

    @br.compile
    def uploads(x):
        box["n"] += 1
        return x + DEV.tensor(np.full(3, box["n"], np.float32))

    _raises(lambda: [uploads(x) for _ in range(6)], pattern="data uploaded inside")


def test_constant_uploads_inside_are_kept():
    x = DEV.tensor(np.ones(3, np.float32))

    @br.compile
    def f(x):
        return x[[2, 0]] + DEV.tensor(np.array([10.0, 20.0], np.float32))

    for _ in range(5):
        assert f(x).numpy().tolist() == [11.0, 21.0]
    assert f.stats()["replays"] == 3


def test_ops_on_another_device_are_refused():
    x = DEV.tensor(np.ones(3, np.float32))
    other = br.Device.parse("cpu")  # the same device: allowed
    assert br.compile(lambda a: a + other.ones((3,)))(x).numpy().tolist() == [2, 2, 2]
    from burn_remote._device import LocalRuntime

    fake = br.Device("cpu-shadow", LocalRuntime("cpu"))

    @br.compile
    def f(a):
        return a + 1, fake.ones((3,))

    _raises(f, x, pattern=r"another device")


def test_weak_scalar_clash_is_refused():
    x = DEV.tensor(np.ones(3, np.float64))
    f = br.compile(lambda a, s: a * s)
    _raises(f, x, 0.1, pattern=r"meets a float64 tensor")


def test_replays_keep_client_memory_flat():
    """10,000 replays allocate nothing that stays (measured in a process of its own)."""
    seen = replay_memory.measure("cpu")
    assert seen["grew"] < 64 * 1024, seen
    assert seen["refs"] == seen["tensors"], seen
    assert seen["specs"] <= seen["tensors"] + 4, seen
    assert seen["replays"] >= 10_990, seen


@pytest.mark.slow
@pytest.mark.skipif(_UNAVAILABLE["opencl"] is not None, reason=_UNAVAILABLE["opencl"] or "")
@pytest.mark.parametrize("kind", ["mlp", "gpt_lora"])
def test_captured_training_on_opencl_equals_plain_training_bitwise(kind):
    dev = br.Device.opencl()
    plain = train(dev, MODELS[kind], 100, compiled=False)
    captured = train(dev, MODELS[kind], 100, compiled=True)
    assert captured["__stats__"]["replays"] >= 95
    _same(plain, captured)


@pytest.mark.slow
def test_gpt2_small_sized_lora_step_captures_and_matches():
    """GPT-2-small-sized weights (124M parameters, ~500 MB): the state scan and the replay
    bind ~150 frozen base tensors and the adapters; captured steps equal plain ones."""
    cfg = nn.GPTConfig(n_layer=12, n_head=12, d_model=768, vocab=50257, context=8)

    def build(dev):
        nn.seed(5)
        model = br.lora.apply_lora(
            nn.GPT(cfg, device=dev), br.lora.LoraConfig(r=4, alpha=8, target_modules=["c_attn"])
        )
        opt = optim.AdamW(model, lr=1e-3, schedule=optim.cosine(10, warmup_steps=2))
        ids = np.random.default_rng(6).integers(0, cfg.vocab, (6, 1, cfg.context + 1))

        def step(x, y):
            loss = model.loss(x, y)
            loss.backward()
            optim.clip_grad_norm(model, 1.0)
            opt.step()
            opt.zero_grad()
            return loss

        def batch(i):
            return DEV.tensor(ids[i, :, :-1]), DEV.tensor(ids[i, :, 1:])

        return model, step, batch

    results = []
    for compiled in (False, True):
        model, step, batch = build(DEV)
        run = br.compile(step) if compiled else step
        for i in range(6):
            run(*batch(i))
            DEV.flush()
        if compiled:
            assert run.stats()["replays"] == 3
        results.append({n: t.numpy() for n, t in model.named_parameters() if ".lora_" in n})
        del model, step, run
        gc.collect()
    _same(*results)
