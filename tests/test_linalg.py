"""burn_remote.linalg against NumPy/SciPy, and its gradients against finite differences."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
from burn_remote import Device, RecordError
from burn_remote import linalg as la
from support.gradcheck import check_grad

RNG = np.random.default_rng(7)


@pytest.fixture
def cpu():
    return Device.cpu()


def _well_conditioned(*batch, n=3):
    return RNG.standard_normal((*batch, n, n)) + 3 * np.eye(n)


def _spd(n=3):
    m = RNG.standard_normal((n, n))
    return m @ m.T + n * np.eye(n)


def test_forward_matches_numpy_and_scipy(cpu):
    a, b = _well_conditioned(2), RNG.standard_normal((2, 3, 4))
    A, B = cpu.tensor(a), cpu.tensor(b)
    np.testing.assert_allclose(la.solve(A, B).numpy(), np.linalg.solve(a, b), rtol=1e-10)
    vec = RNG.standard_normal((2, 3))
    np.testing.assert_allclose(
        la.solve(A, cpu.tensor(vec)).numpy(), np.linalg.solve(a, vec[..., None])[..., 0]
    )
    np.testing.assert_allclose(la.inv(A).numpy(), np.linalg.inv(a), rtol=1e-10)
    np.testing.assert_allclose(la.det(A).numpy(), np.linalg.det(a), rtol=1e-10)
    s = _spd(4)
    np.testing.assert_allclose(
        la.cholesky(cpu.tensor(s)).numpy(), scipy.linalg.cholesky(s, lower=True), rtol=1e-10
    )
    m = RNG.standard_normal((5, 3))
    q, r = la.qr(cpu.tensor(m))
    np.testing.assert_allclose(q.numpy() @ r.numpy(), m, atol=1e-12)
    np.testing.assert_allclose(np.abs(r.numpy()), np.abs(scipy.linalg.qr(m, mode="economic")[1]))
    np.testing.assert_allclose(la.svdvals(cpu.tensor(m)).numpy(), scipy.linalg.svdvals(m))


def test_norms_follow_numpy(cpu):
    x = RNG.standard_normal((3, 4))
    X = cpu.tensor(x)
    cases = [
        ({}, np.linalg.norm(x)),
        ({"ord": "fro"}, np.linalg.norm(x, "fro")),
        ({"ord": "nuc"}, np.linalg.norm(x, "nuc")),
        ({"ord": 2}, np.linalg.norm(x, 2)),
        ({"ord": 1, "axis": 1}, np.linalg.norm(x, 1, axis=1)),
        ({"ord": np.inf, "axis": 0}, np.linalg.norm(x, np.inf, axis=0)),
        ({"axis": 1, "keepdims": True}, np.linalg.norm(x, axis=1, keepdims=True)),
    ]
    for kwargs, expected in cases:
        np.testing.assert_allclose(la.norm(X, **kwargs).numpy(), expected, err_msg=str(kwargs))


def test_shape_errors_raise_at_record_time(cpu):
    with pytest.raises(RecordError, match=r"linalg\.inv: expected square"):
        la.inv(cpu.tensor(np.ones((2, 3))))
    with pytest.raises(RecordError, match=r"linalg\.solve: right-hand side"):
        la.solve(cpu.tensor(np.eye(3)), cpu.tensor(np.ones((2, 1))))


def test_graph_uses_linalg_wire_names(cpu):
    la.det(cpu.tensor(np.eye(2)))
    assert [n.op for n in cpu._rec.pending] == ["linalg.det@1"]


def test_solve_gradient():
    check_grad(la.solve, _well_conditioned(), RNG.standard_normal((3, 2)))
    check_grad(la.solve, _well_conditioned(2), RNG.standard_normal((2, 3)))


def test_cholesky_gradient():
    # through A = M M^T + 3I, so every perturbation keeps A symmetric positive-definite
    def chol_of(m):
        return la.cholesky(m @ m.T + m.device.tensor(3 * np.eye(3)))

    check_grad(chol_of, RNG.standard_normal((3, 3)))


def test_inv_det_qr_svdvals_norm_gradients():
    check_grad(la.inv, _well_conditioned())
    check_grad(la.det, _well_conditioned())
    m = RNG.standard_normal((4, 3))
    check_grad(la.qr, m)
    check_grad(lambda t: la.qr(t)[1], m)  # Q unused: its gradient is None in the rule
    check_grad(la.svdvals, m)
    check_grad(lambda t: la.norm(t, axis=1), m)
    check_grad(lambda t: la.norm(t, ord="nuc"), m)
