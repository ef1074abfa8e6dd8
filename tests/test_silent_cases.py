"""The cases that used to give silently wrong results, each beside what PyTorch does.

Each test failed before its fix: an update that did nothing, a dtype changed on upload, a
second backward that was a no-op, a deepcopy on a second "cpu", a pickle of the whole device.
"""

from __future__ import annotations

import copy
import pickle

import burn_remote as br
import ml_dtypes
import numpy as np
import pytest
from burn_remote import Device, nn, optim

torch = pytest.importorskip("torch")
DEV = Device.cpu()


def test_inplace_update_under_no_grad_changes_the_parameter():
    model = nn.Linear(3, 2)
    twin = torch.nn.Linear(3, 2)
    with torch.no_grad():
        twin.weight.copy_(torch.from_numpy(model.weight.numpy()))
        twin.bias.copy_(torch.from_numpy(model.bias.numpy()))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for m, t in ((model, DEV.tensor), (twin, torch.from_numpy)):
        m(t(x)).sum().backward()
        with br.no_grad() if m is model else torch.no_grad():
            for p in m.parameters():
                p -= 0.1 * p.grad
                p *= 2.0
    np.testing.assert_allclose(model.weight.numpy(), twin.weight.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(model.bias.numpy(), twin.bias.detach().numpy(), rtol=1e-6)


def test_inplace_on_a_leaf_that_requires_grad_raises_like_torch():
    p = DEV.tensor([1.0, 2.0], requires_grad=True)
    tp = torch.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="in-place"):
        tp += 1
    with pytest.raises(RuntimeError, match="in-place"):
        p += 1


def test_inplace_keeps_identity_dtype_and_shape_rules():
    x = DEV.tensor([1.0, 2.0])
    alias = x
    x += 1
    assert alias is x and x.tolist() == [2.0, 3.0] and x.dtype == "float32"
    i = DEV.tensor([1, 2])
    with pytest.raises(RuntimeError, match="can't be cast"):
        i += 0.5  # torch: result type Float can't be cast to Long
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.tensor([1, 2]).add_(0.5)
    with pytest.raises(RuntimeError, match="shape"):
        x += DEV.tensor([[1.0, 2.0], [3.0, 4.0]])


def test_inplace_on_a_tensor_saved_for_backward_raises_at_backward():
    w = DEV.tensor([1.0, 2.0], requires_grad=True)
    x = DEV.tensor([3.0, 4.0])
    y = (w * x).sum()
    x += 1  # torch raises at backward: a tensor needed for the gradient was modified
    with pytest.raises(RuntimeError, match="modified by an in-place"):
        y.backward()


@pytest.mark.parametrize(
    "dtype", ["float16", "float64", "int32", "uint8", "int8", "bool", "bfloat16", "float32"]
)
def test_dtypes_are_kept_from_numpy_and_torch(dtype):
    values = np.array([[0, 1, 2], [3, 4, 5]]).astype(
        ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    )
    assert DEV.tensor(values).dtype == dtype
    tt = torch.tensor(values.astype(np.float32)).to(getattr(torch, dtype))
    t = DEV.tensor(tt)
    assert t.dtype == dtype and t.shape == (2, 3)
    np.testing.assert_array_equal(t.numpy().astype(np.float32), values.astype(np.float32))


def test_python_scalars_default_like_torch():
    assert DEV.tensor([1.5, 2.0]).dtype == str(torch.tensor([1.5, 2.0]).dtype).split(".")[1]
    assert DEV.tensor([1, 2]).dtype == "int64" == str(torch.tensor([1, 2]).dtype).split(".")[1]


def test_second_backward_raises_like_torch():
    w = DEV.tensor([1.0, 2.0], requires_grad=True)
    loss = (w * w).sum()
    loss.backward()
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()
    assert w.grad.tolist() == [2.0, 4.0]
    tw = torch.tensor([1.0, 2.0], requires_grad=True)
    tl = (tw * tw).sum()
    tl.backward()
    with pytest.raises(RuntimeError, match="second time"):
        tl.backward()


def test_backward_on_a_leaf_twice_accumulates_like_torch():
    w = DEV.tensor(3.0, requires_grad=True)
    w.backward()
    w.backward()
    tw = torch.tensor(3.0, requires_grad=True)
    tw.backward()
    tw.backward()
    assert w.grad.item() == tw.grad.item() == 2.0


def test_deepcopy_keeps_the_device_and_copies_values():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    clone = copy.deepcopy(model)
    assert clone.device is model.device is DEV
    x = DEV.tensor(np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(clone(x).numpy(), model(x).numpy())  # mixes with x
    opt = optim.SGD(clone, lr=0.5)
    clone(x).sum().backward()
    opt.step()
    assert not np.allclose(clone(x).numpy(), model(x).numpy())  # independent values
    t = DEV.tensor([1.0], requires_grad=True)
    c = copy.deepcopy(t)
    assert c.device is DEV and c.requires_grad and c is not t
    assert copy.copy(DEV) is DEV and copy.deepcopy(DEV) is DEV


def test_pickle_holds_the_values_only():
    t = DEV.tensor([1.0, 2.0, 3.0])
    blob = pickle.dumps(t)
    assert len(blob) < 1024
    back = pickle.loads(blob)
    assert back.device is DEV and back.tolist() == [1.0, 2.0, 3.0] and back.dtype == "float32"
    model = nn.Linear(2, 2)
    again = pickle.loads(pickle.dumps(model))
    np.testing.assert_array_equal(again.weight.numpy(), model.weight.numpy())


def test_pickle_of_a_remote_tensor_is_refused_clearly():
    from burn_remote._recorder import Recorder

    dev = br.RemoteDevice.over(runtime=None, peer_id="k51")
    assert isinstance(dev._rec, Recorder)
    t = dev.scalar(1.0)
    with pytest.raises(TypeError, match=r"remote.*pickle `t.numpy\(\)`|server"):
        pickle.dumps(t)
    assert copy.deepcopy(t).device is dev


def test_a_tensor_does_not_alias_the_callers_array():
    a = np.ones(3, np.float32)
    t = DEV.tensor(a)
    a[0] = 5  # torch.tensor copies: the tensor keeps its values
    tt = torch.ones(3)
    u = DEV.tensor(tt)
    tt[0] = 7
    assert t.tolist() == [1.0, 1.0, 1.0] and u.tolist() == [1.0, 1.0, 1.0]
    assert torch.tensor(np.ones(3)).tolist() == [1.0, 1.0, 1.0]


def test_inplace_on_an_intermediate_stays_on_the_tape_like_torch():
    """ResNet's `out += identity`, `h *= mask` and `x += x` on tensors that track gradients."""
    rng = np.random.default_rng(5)
    a, m = rng.normal(size=(3, 4)).astype(np.float32), (rng.random((3, 4)) > 0.5)
    grads = []
    for lib, make in ((None, lambda v: DEV.tensor(v, requires_grad=True)),
                      (torch, lambda v: torch.tensor(v, requires_grad=True))):  # fmt: skip
        x = make(a)
        identity = x * 2
        out = (x * 3).sin()  # sin saves its input (tanh, its output: torch would refuse)
        out += identity
        out *= (DEV.tensor(m) if lib is None else torch.from_numpy(m)).float()
        out += out
        (out * out).sum().backward()
        grads.append(x.grad.numpy() if lib is None else x.grad.detach().numpy())
        assert out.requires_grad
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-5, atol=1e-6)


def test_inplace_on_an_output_whose_gradient_needs_it_uses_the_old_value():
    """exp's gradient is its output: after `y += 1` it must still be exp(x), not exp(x) + 1
    (torch refuses this case; here the stand-in keeps the old value for the gradient)."""
    x = DEV.tensor([0.5, -1.0], requires_grad=True)
    y = x.exp()
    y += 1
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.exp([0.5, -1.0]), rtol=1e-6)
