"""deepcopy and pickle of models on a RemoteDevice (a real server): the copy stays on the
same device and trains independently; a pickle is refused with a message, not 4 MB of
device state."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from burn_remote import RemoteDevice, nn, optim


def test_deepcopy_on_a_remote_device_stays_there_and_is_independent(server) -> None:
    dev = RemoteDevice(server.target)
    nn.seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).to(dev)
    clone = copy.deepcopy(model)
    assert clone.device is dev
    x = dev.tensor(np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(clone(x).numpy(), model(x).numpy())
    opt = optim.SGD(clone, lr=0.5)
    clone(x).sum().backward()
    opt.step()
    assert not np.allclose(clone(x).numpy(), model(x).numpy())
    with pytest.raises(TypeError, match="t.numpy"):
        pickle.dumps(model)
    state = pickle.loads(pickle.dumps(model.state_dict()))  # arrays pickle as arrays
    assert set(state) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    dev.close()
