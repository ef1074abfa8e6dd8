"""NumPy-style indexing: ints, slices (negative steps too), None, Ellipsis, integer index
tensors; values, shapes, errors and gradients against NumPy."""

from __future__ import annotations

import numpy as np
import pytest
from burn_remote import OpFailed
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, basic_indices

FEW = settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

X = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)

BASIC_KEYS = [
    0,
    -1,
    (1, 2),
    (-1, -2, -3, -4),
    slice(None),
    slice(None, None, -1),
    (slice(None), slice(2, None, -1)),
    (slice(None), slice(None), slice(None, None, -2)),
    (Ellipsis, slice(4, 0, -2)),
    (Ellipsis, 1),
    (0, Ellipsis, 1),
    (None,),
    (None, 0, None, Ellipsis, None),
    (slice(1, 1),),
    (slice(5, 0),),  # empty
    (Ellipsis,),
    (),
    (slice(-100, 100), slice(-2, None)),
    (1, slice(None), None, -1),
    (Ellipsis, None),
    np.int64(1),
]


@pytest.mark.parametrize("key", BASIC_KEYS, ids=repr)
def test_basic_indexing_matches_numpy(device, key):
    got = device.tensor(X)[key]
    want = X[key]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.numpy(), want)


@FEW
@given(data=st.data(), shape=array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4))
def test_generated_basic_indices(cpu, data, shape):
    x = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    key = data.draw(basic_indices(shape, min_dims=0, allow_newaxis=True, allow_ellipsis=True))
    got = cpu.tensor(x)[key]
    assert got.shape == x[key].shape
    np.testing.assert_array_equal(got.numpy(), x[key])


def test_zero_d_tensor(device):
    t = device.tensor(np.float32(3.0))
    assert t[()].shape == () and t[()].item() == 3.0
    assert t[None].shape == (1,)
    assert t[...].shape == ()
    assert t[None, ..., None].shape == (1, 1)
    with pytest.raises(IndexError, match="too many"):
        t[0]


@pytest.mark.parametrize("index_dtype", [np.int64, np.int32, np.uint8])
def test_integer_index_tensors(device, index_dtype):
    idx = np.array([[1, 0], [1, 1]], dtype=index_dtype)
    t = device.tensor(X)
    i = device.tensor(idx)
    for key in [
        (i,),
        (slice(None), i),
        (Ellipsis, i),
        (1, i),
        (0, slice(None), i),  # a slice between: the index's dims go first, as in NumPy
        (i, slice(None), 0),
        (slice(None), None, i),
        (1, None, i),
        (i, None, slice(None, None, -1)),
        (slice(None, None, -1), i, 2),
    ]:
        np_key = tuple(idx if k is i else k for k in key)
        want = X[np_key]
        got = t[key]
        assert got.shape == want.shape, key
        np.testing.assert_array_equal(got.numpy(), want, err_msg=str(key))


def test_list_and_array_indices(device):
    t = device.tensor(X)
    np.testing.assert_array_equal(t[[1, 0, 1]].numpy(), X[[1, 0, 1]])
    np.testing.assert_array_equal(t[:, np.array([2, 2])].numpy(), X[:, np.array([2, 2])])
    np.testing.assert_array_equal(t[..., [4]].numpy(), X[..., [4]])
    # a 0-d index tensor drops the axis like an int
    assert t[device.tensor(np.array(1))].shape == X[1].shape
    np.testing.assert_array_equal(t[device.tensor(np.array(1))].numpy(), X[1])
    # negative entries count from the end, as in NumPy
    np.testing.assert_array_equal(t[:, [-1, 0]].numpy(), X[:, [-1, 0]])
    # an empty index
    np.testing.assert_array_equal(t[np.zeros(0, np.int64)].numpy(), X[np.zeros(0, np.int64)])


def test_index_errors(device):
    t = device.tensor(X)
    with pytest.raises(IndexError, match="out of bounds"):
        t[2]
    with pytest.raises(IndexError, match="out of bounds"):
        t[:, -4]
    with pytest.raises(IndexError, match="too many"):
        t[0, 0, 0, 0, 0]
    with pytest.raises(IndexError, match="single ellipsis"):
        t[..., 0, ...]
    with pytest.raises(IndexError, match="only one"):
        t[[0], [0]]
    with pytest.raises(IndexError, match="boolean"):
        t[device.tensor(np.array([True, False]))]
    with pytest.raises(IndexError, match="integers"):
        t[[0.5]]
    with pytest.raises(IndexError, match="unsupported"):
        t["a"]
    bad = t[device.tensor(np.array([0, 5]))]  # values are only known when the graph runs
    with pytest.raises(OpFailed, match="index_select"):
        bad.numpy()


def test_indexing_other_dtypes(device):
    for x in (X.astype(np.int8), X > 50, X.astype(np.uint8)):
        t = device.tensor(x)
        got = t[1, ::-1, [0, 3]]
        assert got.dtype == t.dtype
        np.testing.assert_array_equal(got.numpy(), x[1, ::-1, [0, 3]])


# --- gradients ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        (1, slice(None, None, -1)),
        (Ellipsis, slice(3, 0, -2)),
        (None, 0, slice(1, 3)),
        (slice(None), -1, None, 2),
    ],
    ids=repr,
)
def test_basic_indexing_grad(cpu, key):
    x = np.random.default_rng(0).standard_normal((2, 3, 4))
    t = cpu.tensor(x, requires_grad=True)
    w = np.random.default_rng(1).standard_normal(x[key].shape)
    (t[key] * cpu.tensor(w)).sum().backward()
    want = np.zeros_like(x)
    want[key] += w
    np.testing.assert_allclose(t.grad.numpy(), want)


@pytest.mark.parametrize(
    "key",
    [
        (np.array([[0, 2], [2, 2]]),),
        (slice(None), np.array([3, 3, 0])),
        (1, slice(None), np.array([1, 1])),
        (np.array([1, 0, 1]), slice(None, None, -1), 2),
    ],
    ids=lambda k: str(tuple(getattr(e, "tolist", lambda e=e: e)() for e in k)),
)
def test_index_tensor_grad_adds_duplicates(cpu, key):
    x = np.random.default_rng(2).standard_normal((3, 4, 5))
    t = cpu.tensor(x, requires_grad=True)
    tkey = tuple(cpu.tensor(k) if isinstance(k, np.ndarray) else k for k in key)
    w = np.random.default_rng(3).standard_normal(x[key].shape)
    (t[tkey] * cpu.tensor(w)).sum().backward()
    want = np.zeros_like(x)
    np.add.at(want, key, w)
    np.testing.assert_allclose(t.grad.numpy(), want)
