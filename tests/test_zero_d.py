"""A 0-d tensor (a scalar parameter, a loss, a step count) keeps shape () through every path
that copies it to contiguous memory: np.ascontiguousarray makes a 0-d array 1-d, so each of
these once handed back shape (1,) where PyTorch and Device.cpu() give ()."""

from __future__ import annotations

import math
import sys

import burn_remote as br
import numpy as np
from burn_remote import functional as F
from burn_remote import nn, optim
from burn_remote.server._state import ServerState
from burn_remote.server.jobs._checkpoint import load_checkpoint, save_checkpoint
from burn_remote.server.jobs._runtime import JobRuntime


class _Scaled(nn.Module):
    def __init__(self, dev) -> None:
        self.scale = dev.tensor(np.array(1.5, np.float32), requires_grad=True)
        self.lin = nn.Linear(3, 2).to(dev)

    def forward(self, x):
        return self.lin(x) * self.scale


def test_safetensors_keep_a_scalar_a_scalar(tmp_path):
    path = tmp_path / "s.safetensors"
    nn.save_safetensors({"s": np.array(2.0, np.float32), "v": np.ones(2, np.float32)}, path)
    back = nn.load_safetensors(path)
    assert back["s"].shape == () and back["s"] == 2.0
    assert back["v"].shape == (2,)


def test_a_job_checkpoint_restores_a_scalar_parameter_and_its_moments_as_scalars(tmp_path):
    dev = br.Device.cpu()
    model = _Scaled(dev)
    opt = optim.Adam(model, lr=0.1)
    x, y = dev.tensor(np.ones((4, 3), np.float32)), dev.tensor(np.zeros((4, 2), np.float32))
    F.mse_loss(model(x), y).backward()
    opt.step()
    want = model.scale.numpy()
    save_checkpoint(tmp_path / "c.safetensors", opt, 1, np.random.default_rng(0))
    again = _Scaled(dev)
    opt2 = optim.Adam(again, lr=0.1)
    load_checkpoint(tmp_path / "c.safetensors", opt2, np.random.default_rng(1))
    assert again.scale.shape == () and again.scale.numpy() == want
    moments = opt2.state[id(again.scale)]
    assert moments and all(t.shape == () for t in moments.values()), moments


def test_a_job_uploads_a_scalar_as_a_scalar():
    rt = JobRuntime(ServerState("cpu"), "job 1")
    rt.upload(7, np.array(3.0, np.float32))
    assert rt.store[7].shape == ()


def test_optimizers_update_a_scalar_parameter_as_torch_does():
    import torch

    for make, make_torch in [
        (lambda ps: optim.Adam(ps, lr=0.1), lambda ps: torch.optim.Adam(ps, lr=0.1)),
        (lambda ps: optim.AdamW(ps, lr=0.1), lambda ps: torch.optim.AdamW(ps, lr=0.1)),
        (
            lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9),
            lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        ),
    ]:
        dev = br.Device.cpu()
        model = _Scaled(dev)
        w, b = model.lin.weight.numpy(), model.lin.bias.numpy()
        opt = make(model)
        ts = torch.tensor(1.5, requires_grad=True)
        tw, tb = torch.tensor(w, requires_grad=True), torch.tensor(b, requires_grad=True)
        topt = make_torch([ts, tw, tb])
        x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
        for _ in range(3):
            F.mse_loss(model(dev.tensor(x)), dev.tensor(np.zeros((4, 2), np.float32))).backward()
            opt.step()
            opt.zero_grad()
            tx = torch.tensor(x)
            torch.nn.functional.mse_loss((tx @ tw.T + tb) * ts, torch.zeros(4, 2)).backward()
            topt.step()
            topt.zero_grad()
        assert model.scale.shape == ()
        np.testing.assert_allclose(model.scale.numpy(), ts.detach().numpy(), rtol=1e-5)


def test_exact_gelu_of_a_scalar_without_scipy(monkeypatch):
    """Without SciPy (a core install) erf runs Python's erf per element, which hands back a
    bare float for a 0-d input: the kernel once called .astype on it and failed."""
    monkeypatch.setitem(sys.modules, "scipy.special", None)  # `import scipy.special` fails
    dev = br.Device.cpu()
    for value in (0.5, -1.25):
        got = F.gelu(dev.tensor(np.array(value, np.float32))).numpy()
        want = value * 0.5 * (1 + math.erf(value / math.sqrt(2)))
        assert got.shape == () and got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-6)
