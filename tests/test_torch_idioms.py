"""Everyday PyTorch idioms, each run beside its torch twin (torch is the oracle)."""

from __future__ import annotations

import copy

import burn_remote as br
import numpy as np
import pytest
from burn_remote import Device, nn, optim
from burn_remote import functional as F

torch = pytest.importorskip("torch")
TF = torch.nn.functional
DEV = Device.cpu()
X = np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32)


def _pair(a=X):
    return DEV.tensor(a), torch.from_numpy(a.copy())


def _close(ours, theirs, tol=1e-5):
    ours = ours.numpy() if isinstance(ours, br.Tensor) else np.asarray(ours)
    np.testing.assert_allclose(ours, theirs.detach().numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("name", ["sum", "mean", "amax", "logsumexp", "var", "std", "argmax"])
def test_dim_and_keepdim(name):
    x, t = _pair()
    ours_name = {"amax": "max"}.get(name, name)
    for dim, keepdim in ((1, False), (0, True)):
        got = getattr(x, ours_name)(dim=dim, keepdim=keepdim)
        want = getattr(t, name)(dim=dim, keepdim=keepdim)
        if ours_name == "max":
            got = got.values
        _close(got, want)


def test_max_min_with_dim_give_values_and_indices():
    x, t = _pair()
    for name in ("max", "min"):
        values, indices = getattr(x, name)(dim=1)
        tv, ti = getattr(t, name)(dim=1)
        _close(values, tv)
        assert indices.tolist() == ti.tolist()
    assert x.max().item() == pytest.approx(t.max().item())


def test_softmax_cat_stack_squeeze_with_dim():
    x, t = _pair()
    _close(F.softmax(x, dim=0), TF.softmax(t, dim=0))
    _close(F.log_softmax(x, dim=1), TF.log_softmax(t, dim=1))
    _close(F.cat([x, x], dim=1), torch.cat([t, t], dim=1))
    _close(F.stack([x, x], dim=0), torch.stack([t, t], dim=0))
    assert x.unsqueeze(dim=1).shape == tuple(t.unsqueeze(dim=1).shape)
    assert x.squeeze(dim=0).shape == tuple(t.squeeze(dim=0).shape)  # not 1: unchanged, as torch


def test_size_numel_dim_flatten_view_as():
    x, t = _pair(np.zeros((2, 3, 4), np.float32))
    assert x.size(0) == t.size(0) and x.size(-1) == t.size(-1)
    assert x.size() == tuple(t.size()) and x.numel() == t.numel() and x.dim() == t.dim()
    assert x.size == 24  # NumPy's attribute still reads as the count
    assert x.flatten(1).shape == tuple(torch.flatten(t, 1).shape)
    assert x.flatten(0, 1).shape == tuple(t.flatten(0, 1).shape)
    assert x.view_as(x.reshape(6, 4)).shape == (6, 4)


def test_format_and_repr_show_values():
    x, t = _pair(np.array([1.5, 2.25], np.float32))
    loss = x.sum()
    assert f"{loss:.4f}" == f"{t.sum():.4f}" == "3.7500"
    assert "1.5" in repr(x) and "2.25" in repr(x) and "cpu" in repr(x)
    assert repr(x).startswith("tensor(")
    with pytest.raises(TypeError):
        f"{x:.2f}"
    with pytest.raises((TypeError, ValueError, RuntimeError)):
        f"{t:.2f}"


def test_print_model_like_torch():
    nn.seed(0)
    ours = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Dropout(0.25), nn.Linear(4, 2))
    theirs = torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Dropout(0.25), torch.nn.Linear(4, 2)
    )
    assert repr(ours) == repr(theirs)
    conv, tconv = nn.Conv2d(1, 32, 3, 1), torch.nn.Conv2d(1, 32, 3, 1)
    assert repr(conv) == repr(tconv)
    assert repr(nn.BatchNorm2d(8)) == repr(torch.nn.BatchNorm2d(8))


def test_to_device_string_and_dtype():
    x, t = _pair()
    assert x.to("cpu") is x and x.cpu() is x
    assert x.to("float16").dtype == "float16" == str(t.to(torch.float16).dtype)[6:]
    assert x.to(DEV, "float64").dtype == "float64"
    assert x.to(np.float64).dtype == "float64"
    assert x.double().dtype == "float64" and x.half().dtype == "float16"


def test_nll_loss_and_reductions():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(6, 4)).astype(np.float32)
    target = np.array([0, 3, 1, -100, 2, 2])
    x, t = _pair(logits)
    y, ty = DEV.tensor(target), torch.from_numpy(target)
    for red in ("mean", "sum", "none"):
        _close(F.nll_loss(F.log_softmax(x, dim=1), y, reduction=red),
               TF.nll_loss(TF.log_softmax(t, dim=1), ty, reduction=red))  # fmt: skip
        _close(F.cross_entropy(x, y, reduction=red), TF.cross_entropy(t, ty, reduction=red))
        _close(F.cross_entropy(x, y, reduction=red, label_smoothing=0.1),
               TF.cross_entropy(t, ty, reduction=red, label_smoothing=0.1))  # fmt: skip
        _close(F.mse_loss(x, x * 0.5, reduction=red), TF.mse_loss(t, t * 0.5, reduction=red))
    with pytest.raises(ValueError, match="reduction"):
        F.mse_loss(x, x, reduction="avg")


def test_nll_loss_gradient_matches_torch():
    logits = np.random.default_rng(2).normal(size=(5, 3)).astype(np.float32)
    target = np.array([0, 2, 1, 1, 0])
    x = DEV.tensor(logits, requires_grad=True)
    t = torch.tensor(logits, requires_grad=True)
    F.nll_loss(F.log_softmax(x, dim=1), DEV.tensor(target), reduction="sum").backward()
    TF.nll_loss(TF.log_softmax(t, dim=1), torch.from_numpy(target), reduction="sum").backward()
    _close(x.grad, t.grad)


@pytest.mark.parametrize("cls", ["BatchNorm1d", "BatchNorm2d"])
def test_batchnorm_train_and_eval(cls):
    shape = (6, 3) if cls == "BatchNorm1d" else (4, 3, 5, 5)
    data = np.random.default_rng(3).normal(2.0, 3.0, size=shape).astype(np.float32)
    ours, theirs = getattr(nn, cls)(3), getattr(torch.nn, cls)(3)
    x, t = DEV.tensor(data, requires_grad=True), torch.tensor(data, requires_grad=True)
    for _ in range(2):
        _close(ours(x), theirs(t), 1e-4)
    (ours(x) * DEV.tensor(data)).sum().backward()
    (theirs(t) * torch.from_numpy(data)).sum().backward()
    _close(x.grad, t.grad, 1e-3)
    _close(ours.weight.grad, theirs.weight.grad, 1e-3)
    _close(ours.running_mean, theirs.running_mean)
    _close(ours.running_var, theirs.running_var, 1e-4)
    assert ours.num_batches_tracked.item() == theirs.num_batches_tracked.item()
    ours.eval(), theirs.eval()
    _close(ours(x), theirs(t), 1e-4)
    assert set(ours.state_dict()) == set(theirs.state_dict())


@pytest.mark.parametrize("training", [False, True])
def test_batch_norm_refuses_half_the_running_statistics(training):
    """Running mean and variance go together (torch refuses one without the other too):
    given only one, batch_norm names the missing one instead of failing inside on None."""
    x, stat = DEV.tensor(np.ones((4, 3), np.float32)), DEV.tensor(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="running_var"):
        F.batch_norm(x, stat, None, training=training)
    with pytest.raises(ValueError, match="running_mean"):
        F.batch_norm(x, None, stat, training=training)


@pytest.mark.parametrize(
    ("name", "kwargs", "bound"),
    [
        ("kaiming_uniform_", {"a": 5**0.5}, lambda fi, fo: (6 / (1 + 5) / fi) ** 0.5 * 3**0.5 / 3**0.5),
        ("xavier_uniform_", {}, lambda fi, fo: (6 / (fi + fo)) ** 0.5),
        ("uniform_", {"a": -0.3, "b": 0.3}, lambda fi, fo: 0.3),
    ],
)  # fmt: skip
def test_init_uniform_bounds_match_torch(name, kwargs, bound):
    ours, theirs = nn.Linear(200, 100), torch.nn.Linear(200, 100)
    getattr(nn.init, name)(ours.weight, **kwargs)
    with torch.no_grad():
        getattr(torch.nn.init, name)(theirs.weight, **kwargs)
    b_ours, b_theirs = np.abs(ours.weight.numpy()).max(), theirs.weight.abs().max().item()
    assert b_ours <= bound(200, 100) + 1e-6 and b_theirs <= bound(200, 100) + 1e-6
    assert b_ours == pytest.approx(b_theirs, rel=0.02)


@pytest.mark.parametrize("name", ["kaiming_normal_", "xavier_normal_", "normal_", "trunc_normal_"])
def test_init_normal_spread_matches_torch(name):
    ours, theirs = nn.Linear(300, 200), torch.nn.Linear(300, 200)
    getattr(nn.init, name)(ours.weight)
    with torch.no_grad():
        getattr(torch.nn.init, name)(theirs.weight)
    assert ours.weight.numpy().std() == pytest.approx(theirs.weight.std().item(), rel=0.03)
    nn.init.zeros_(ours.bias)
    nn.init.constant_(ours.weight, 0.5)
    assert ours.bias.tolist() == [0.0] * 200 and ours.weight.numpy().min() == 0.5


def test_arange_eye_randn_and_the_seeded_default_generator():
    assert br.arange(5).tolist() == torch.arange(5).tolist()
    assert br.arange(5).dtype == "int64" and br.arange(0.0, 1.0, 0.25).dtype == "float32"
    np.testing.assert_allclose(br.arange(0.0, 1.0, 0.25).numpy(), torch.arange(0.0, 1.0, 0.25))
    np.testing.assert_array_equal(br.eye(3, 4).numpy(), torch.eye(3, 4).numpy())
    br.manual_seed(7)
    a, u = br.randn(2, 3), br.rand((2, 3))
    br.manual_seed(7)
    b, v = br.randn(2, 3), br.rand((2, 3))
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_array_equal(u.numpy(), v.numpy())
    assert not np.array_equal(a.numpy(), br.randn(2, 3).numpy())
    big = br.randn(200, 200).numpy()
    assert abs(big.mean()) < 0.02 and abs(big.std() - 1) < 0.02
    assert a.shape == tuple(torch.randn(2, 3).shape) and a.dtype == "float32"


def test_optimizer_state_dict_resumes_adam():
    def run(opt_state=None, model_state=None, steps=3):
        nn.seed(0)
        model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 2))
        opt = optim.Adam(model.parameters(), lr=0.05)
        if model_state is not None:
            model.load_state_dict(model_state)
            opt.load_state_dict(opt_state)
        x = DEV.tensor(X)
        for _ in range(steps):
            opt.zero_grad()
            (model(x) ** 2).mean().backward()
            opt.step()
        return model, opt

    straight, _ = run(steps=6)
    first, opt = run(steps=3)
    saved = copy.deepcopy(opt.state_dict())
    resumed, _ = run(saved, first.state_dict(), steps=3)
    for k, v in straight.state_dict().items():
        np.testing.assert_allclose(resumed.state_dict()[k], v, rtol=1e-6, atol=1e-7)
    assert set(saved) >= {"state", "param_groups"} and saved["param_groups"][0]["params"] == [
        0,
        1,
        2,
        3,
    ]
    fresh = run(steps=0)[1]
    with pytest.raises(ValueError, match="groups"):
        fresh.load_state_dict({**saved, "param_groups": saved["param_groups"] * 2})


def test_param_groups_as_dicts_and_lr_changes_like_torch():
    nn.seed(1)
    ours = nn.Sequential(nn.Linear(5, 4), nn.Linear(4, 2))
    theirs = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Linear(4, 2))
    with torch.no_grad():
        for (_, p), q in zip(ours.named_parameters(), theirs.parameters()):
            q.copy_(torch.from_numpy(p.numpy()))
    groups = lambda m: [  # noqa: E731
        {"params": list(m[0].parameters())},
        {"params": list(m[1].parameters()), "lr": 0.01, "momentum": 0.5},
    ]
    o = optim.SGD(groups(ours), lr=0.1)
    t = torch.optim.SGD(groups(theirs), lr=0.1)
    x, tx = _pair(X)
    for step in range(3):
        for opt, model, inp in ((o, ours, x), (t, theirs, tx)):
            opt.zero_grad()
            (model(inp) ** 2).sum().backward()
            opt.step()
            if step == 0:
                for g in opt.param_groups:
                    g["lr"] *= 0.5
    for (_, p), q in zip(ours.named_parameters(), theirs.parameters()):
        _close(p, q)
    with pytest.raises(TypeError, match="unknown"):
        optim.SGD([{"params": ours.parameters(), "betas": (0.9, 0.9)}])


def test_adadelta_and_steplr_match_torch():
    nn.seed(2)
    ours = nn.Linear(5, 3)
    theirs = torch.nn.Linear(5, 3)
    with torch.no_grad():
        theirs.weight.copy_(torch.from_numpy(ours.weight.numpy()))
        theirs.bias.copy_(torch.from_numpy(ours.bias.numpy()))
    o = optim.Adadelta(ours.parameters(), lr=1.0)
    t = torch.optim.Adadelta(theirs.parameters(), lr=1.0)
    so = optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.7)
    st = torch.optim.lr_scheduler.StepLR(t, step_size=1, gamma=0.7)
    x, tx = _pair(X)
    for _ in range(3):
        for opt, model, inp, sched in ((o, ours, x, so), (t, theirs, tx, st)):
            opt.zero_grad()
            (model(inp) ** 2).sum().backward()
            opt.step()
            sched.step()
    assert so.get_last_lr() == pytest.approx(st.get_last_lr())
    _close(ours.weight, theirs.weight)
    _close(ours.bias, theirs.bias)


def test_dataloader_batches_and_keyed_shuffle():
    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    y = np.arange(10)
    loader = br.data.DataLoader(br.data.TensorDataset(x, y), batch_size=4, shuffle=True, key=3)
    tloader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), batch_size=4
    )
    assert len(loader) == len(tloader) == 3
    epoch1 = [(a.numpy(), b.numpy()) for a, b in loader]
    epoch2 = [b.numpy() for _, b in loader]
    assert [len(b) for _, b in epoch1] == [len(b) for _, b in tloader] == [4, 4, 2]
    seen = np.concatenate([b for _, b in epoch1])
    assert sorted(seen) == list(range(10)) and list(seen) != list(range(10))
    for a, b in epoch1:
        np.testing.assert_array_equal(a, x[b])
    assert list(np.concatenate(epoch2)) != list(seen)  # a new order each epoch
    again = br.data.DataLoader(br.data.TensorDataset(x, y), batch_size=4, shuffle=True, key=3)
    assert list(np.concatenate([b.numpy() for _, b in again])) == list(seen)
    plain = br.data.DataLoader(br.data.TensorDataset(x, y), batch_size=4, drop_last=True)
    assert [b.tolist() for _, b in plain] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_dlpack_both_ways_on_cpu():
    x = DEV.tensor(X)
    t = torch.from_dlpack(x)
    np.testing.assert_array_equal(t.numpy(), X)
    np.testing.assert_array_equal(np.from_dlpack(x), X)
    back = br.from_dlpack(torch.from_numpy(X * 2))
    np.testing.assert_array_equal(back.numpy(), X * 2)
    source = np.ones(3, np.float32)
    copied = br.from_dlpack(source)
    source[0] = 9  # a copy: the tensor keeps its values
    assert copied.tolist() == [1.0, 1.0, 1.0]
    bf = br.from_dlpack(torch.ones(2, dtype=torch.bfloat16))
    assert bf.dtype == "bfloat16"


def test_torch_as_tensor_reads_our_tensor():
    x = DEV.tensor(X)
    np.testing.assert_array_equal(torch.as_tensor(x).numpy(), X)
    np.testing.assert_array_equal(torch.tensor(np.asarray(x)).numpy(), X)
    y = br.as_tensor(torch.from_numpy(X))
    assert y.dtype == "float32" and br.as_tensor(y) is y


def test_inplace_method_forms():
    x, t = _pair()
    with br.no_grad():
        x.add_(1).mul_(2).sub_(x, alpha=0.5).div_(3)
    t.add_(1).mul_(2).sub_(t, alpha=0.5).div_(3)
    _close(x, t)
    x.zero_()
    assert x.numpy().max() == 0
    x.fill_(float("nan"))
    x.fill_(2.0)
    assert x.numpy().min() == 2.0  # not NaN: fill_ replaces, it does not multiply
    x.copy_(np.ones((4, 5)))
    assert x.numpy().sum() == 20 and x.dtype == "float32"


def test_module_zero_grad_children_modules():
    m = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    m(DEV.tensor(np.ones((1, 2), np.float32))).sum().backward()
    m.zero_grad()
    assert all(p.grad is None for p in m.parameters())
    assert len(list(m.children())) == 2 and len(list(m.modules())) == 3


def test_nll_loss_refuses_a_torch_style_class_axis_it_would_misread():
    logp = DEV.tensor(np.zeros((2, 4, 3), np.float32))
    with pytest.raises(ValueError, match="class axis"):
        F.nll_loss(logp, DEV.tensor(np.zeros((2, 3), np.int64)))


def test_device_names_like_torch_device():
    assert br.device("cpu") is br.device("CPU") is DEV and br.device(DEV) is DEV
    with pytest.raises(ValueError, match="unknown device 'cdua'"):
        br.device("cdua")
    x = DEV.tensor([1.0])
    with pytest.raises(ValueError, match="unknown device"):
        x.to("gpu")


def test_bare_var_and_std_ask_which_correction():
    x, t = _pair()
    with pytest.raises(TypeError, match="correction"):
        x.var()
    with pytest.raises(TypeError, match="correction"):
        x.std()
    _close(x.std(correction=1), t.std())
    _close(x.var(unbiased=True), t.var())
    np.testing.assert_allclose(x.var(axis=0).numpy(), X.var(axis=0), rtol=1e-5)
