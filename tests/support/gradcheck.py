"""Central finite differences against backward(), in float64, for the extension tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from burn_remote import Device


def _outputs(result):
    return result if isinstance(result, tuple) else (result,)


def check_grad(
    fn: Callable[..., object],
    *arrays: np.ndarray,
    eps: float = 1e-6,
    rtol: float = 1e-5,
    atol: float = 1e-7,
    seed: int = 0,
) -> None:
    """Assert d/dx sum_i <fn(x)_i, w_i> from backward() matches central differences.

    The loss weights every output by fixed random weights, so every output entry counts.
    """
    dev = Device.cpu()
    rng = np.random.default_rng(seed)
    arrays = tuple(np.asarray(a, dtype=np.float64) for a in arrays)
    inputs = [dev.tensor(a, requires_grad=True) for a in arrays]
    outs = _outputs(fn(*inputs))
    weights = [rng.standard_normal(o.shape) for o in outs]
    loss = None
    for o, w in zip(outs, weights):
        term = (o * dev.tensor(w)).sum()
        loss = term if loss is None else loss + term
    loss.backward()

    def value(arrs: Sequence[np.ndarray]) -> float:
        res = _outputs(fn(*[dev.tensor(a) for a in arrs]))
        return sum(float(np.sum(r.numpy() * w)) for r, w in zip(res, weights))

    for k, a in enumerate(arrays):
        numeric = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            plus = [x.copy() for x in arrays]
            minus = [x.copy() for x in arrays]
            plus[k][idx] += eps
            minus[k][idx] -= eps
            numeric[idx] = (value(plus) - value(minus)) / (2 * eps)
        analytic = inputs[k].grad.numpy()
        np.testing.assert_allclose(analytic, numeric, rtol=rtol, atol=atol, err_msg=f"input {k}")
