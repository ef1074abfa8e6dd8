"""Optimizers against hand-computed NumPy updates; groups, freezing, schedules, clipping."""

from __future__ import annotations

import math

import numpy as np
import pytest
from burn_remote import Device, nn, optim

DEV = Device.cpu()


def _params(seed: int = 0):
    rng = np.random.default_rng(seed)
    p0 = rng.standard_normal((3, 4)).astype(np.float32)
    grads = [rng.standard_normal((3, 4)).astype(np.float32) for _ in range(4)]
    return p0, grads


def _run(opt_cls, p0, grads, **kw):
    p = DEV.tensor(p0, requires_grad=True)
    opt = opt_cls([p], **kw)
    out = []
    for g in grads:
        p.grad = DEV.tensor(g)
        opt.step()
        out.append(p.numpy())
    return out


def _adam_ref(p0, grads, lr, b1, b2, eps, wd, decoupled):
    p, m, v = p0.astype(np.float64), 0.0, 0.0
    out = []
    for t, g in enumerate(grads, 1):
        g = g.astype(np.float64)
        if wd and not decoupled:
            g = g + wd * p
        if wd and decoupled:
            p = p * (1 - lr * wd)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        p = p - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
        out.append(p)
    return out


@pytest.mark.parametrize(
    ("cls", "wd", "decoupled"),
    [(optim.Adam, 0.0, False), (optim.Adam, 0.1, False), (optim.AdamW, 0.1, True)],
)
def test_adam_matches_numpy(cls, wd, decoupled):
    p0, grads = _params()
    got = _run(cls, p0, grads, lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=wd)
    want = _adam_ref(p0, grads, 0.05, 0.8, 0.95, 1e-6, wd, decoupled)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def _sgd_ref(p0, grads, lr, mom, nesterov, wd):
    p, buf = p0.astype(np.float64), np.zeros_like(p0, np.float64)
    out = []
    for g in grads:
        g = g + wd * p
        buf = mom * buf + g
        p = p - lr * ((g + mom * buf) if nesterov else buf)
        out.append(p)
    return out


@pytest.mark.parametrize(
    ("mom", "nesterov", "wd"), [(0.0, False, 0.0), (0.9, False, 0.01), (0.9, True, 0.0)]
)
def test_sgd_matches_numpy(mom, nesterov, wd):
    p0, grads = _params(1)
    got = _run(optim.SGD, p0, grads, lr=0.1, momentum=mom, nesterov=nesterov, weight_decay=wd)
    for g, w in zip(got, _sgd_ref(p0, grads, 0.1, mom, nesterov, wd)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_schedules():
    s = optim.cosine(total_steps=110, warmup_steps=10, min_ratio=0.1)
    assert s(0) == pytest.approx(0.1) and s(9) == pytest.approx(1.0)
    assert s(10) == pytest.approx(1.0)
    assert s(60) == pytest.approx(0.1 + 0.9 * 0.5)
    assert s(110) == pytest.approx(0.1) and s(500) == pytest.approx(0.1)
    assert optim.linear_warmup(4)(1) == pytest.approx(0.5) and optim.linear_warmup(4)(99) == 1


def _model():
    nn.seed(3)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def test_lr_schedule_never_reregisters_a_graph():
    model = _model()
    sched = optim.cosine(total_steps=8, warmup_steps=3)
    opt = optim.AdamW(model, lr=0.1, schedule=sched)
    x, y = DEV.tensor(np.ones((5, 4), np.float32)), DEV.tensor(np.zeros((5, 2), np.float32))
    seen, lrs = [], []
    for _ in range(8):
        lrs.append(opt.lr)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optim.clip_grad_norm(model, 1.0)
        opt.step()
        opt.zero_grad()
        loss.item()
        seen.append(DEV.stats()["graphs_registered"])
    assert len(set(lrs)) > 4  # the lr really changed
    assert seen[2:] == [seen[1]] * 6  # step 1 creates the moments; from step 2 on, replays


def test_lr_binding_is_used():
    """The scheduled value, not the base lr, reaches the update."""
    p0, grads = _params(2)
    sched = optim.linear_warmup(4)
    got = _run(optim.SGD, p0, grads[:2], lr=1.0, schedule=sched)
    np.testing.assert_allclose(got[0], p0 - 0.25 * grads[0], rtol=1e-6)
    np.testing.assert_allclose(got[1], got[0] - 0.5 * grads[1], rtol=1e-6)


def test_clip_grad_norm_on_device():
    rng = np.random.default_rng(4)
    gs = [rng.standard_normal(s).astype(np.float32) * 3 for s in ((3, 4), (5,))]
    ps = [DEV.tensor(np.zeros_like(g), requires_grad=True) for g in gs]
    for p, g in zip(ps, gs):
        p.grad = DEV.tensor(g)
    norm = optim.clip_grad_norm(ps, 2.0)
    want = math.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in gs))
    assert norm.item() == pytest.approx(want, rel=1e-5)
    for p, g in zip(ps, gs):
        np.testing.assert_allclose(p.grad.numpy(), g * 2.0 / (want + 1e-6), rtol=1e-5)
    small = DEV.tensor(np.zeros(2, np.float32), requires_grad=True)
    small.grad = DEV.tensor(np.array([0.3, 0.4], np.float32))
    optim.clip_grad_norm([small], 2.0)
    np.testing.assert_allclose(small.grad.numpy(), [0.3, 0.4], rtol=1e-6)


def test_param_groups_select_by_glob_regex_predicate():
    model = _model()
    groups = [
        optim.ParamGroup("*.bias", weight_decay=0.0, name="biases"),
        optim.ParamGroup(regex=r"^0\.", lr=0.5, name="first"),
        optim.ParamGroup(predicate=lambda n, t: t.ndim == 2, lr=0.25, name="matrices"),
    ]
    opt = optim.AdamW(model, lr=0.1, groups=groups)
    names = {g.name: [n for n, _ in g.params] for g in opt.groups}
    assert names == {
        "biases": ["0.bias", "2.bias"],
        "first": ["0.weight"],
        "matrices": ["2.weight"],
    }
    assert opt.group("biases").settings["weight_decay"] == 0.0
    assert opt.group("first").settings["lr"] == 0.5
    assert opt.group("matrices").settings["weight_decay"] == 0.01
    with pytest.raises(ValueError, match="selects no parameter"):
        optim.SGD(model, groups=[optim.ParamGroup("nothing.*")])
    with pytest.raises(TypeError, match="unknown settings"):
        optim.SGD(model, groups=[optim.ParamGroup("*", betas=(0.9, 0.9))])


def test_predicate_group_matches_only_with_the_tensor():
    """A predicate reads the tensor; a name alone gets a clear error rather than a None
    handed to the predicate (which would fail inside it, or answer wrongly)."""
    group = optim.ParamGroup(predicate=lambda n, t: t.ndim == 2)
    w = DEV.tensor(np.zeros((2, 3), np.float32))
    assert group.matches("w", w)
    with pytest.raises(TypeError, match="needs the tensor"):
        group.matches("w")
    assert optim.ParamGroup("w*").matches("w")  # a glob needs only the name
    with pytest.raises(ValueError, match="empty list of patterns"):
        optim.ParamGroup([])  # (it passed as "one of pattern, regex, predicate", then
        # failed at the first match calling the absent predicate)


def test_group_lr_applies_per_group():
    model = _model()
    before = model.state_dict()
    opt = optim.SGD(model, lr=0.0, groups=[optim.ParamGroup("2.*", lr=0.1)])
    x = DEV.tensor(np.ones((5, 4), np.float32))
    model(x).sum().backward()
    opt.step()
    after = model.state_dict()
    assert np.array_equal(before["0.weight"], after["0.weight"])
    assert not np.array_equal(before["2.weight"], after["2.weight"])


def test_freeze_and_unfreeze():
    model = _model()
    opt = optim.SGD(model, lr=0.1, groups=[optim.ParamGroup("0.*", name="first")])
    opt.freeze("first")
    assert [n for n, _ in model.named_parameters()] == ["2.weight", "2.bias"]
    before = model.state_dict()
    x = DEV.tensor(np.ones((5, 4), np.float32))
    model(x).sum().backward()
    opt.step()
    after = model.state_dict()
    assert np.array_equal(before["0.weight"], after["0.weight"])
    assert not np.array_equal(before["2.bias"], after["2.bias"])
    opt.unfreeze("first")
    assert len(list(model.named_parameters())) == 4
    assert optim.ParamGroup("2.*").freeze(model) == 2
    assert [n for n, _ in model.named_parameters()] == ["0.weight", "0.bias"]
