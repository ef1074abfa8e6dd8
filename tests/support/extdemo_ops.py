"""An extension defined outside the package, as a user's would be: `testext`, version 1.

test_extensions*.py use it locally and, through a throwaway dist-info that announces it in
the ``burn_remote.extensions`` entry-point group, from a separate "server" process.
"""

from __future__ import annotations

import numpy as np
from burn_remote import Extension
from burn_remote.protocol.registry import NOT_DIFFERENTIABLE, ShapeError

testext = Extension("testext", version="1", doc="Test-only ops.")


def _same(xs, attrs):
    if xs[0].dtype not in ("float32", "float64"):
        raise ShapeError(f"testext.scale_shift: expected a float tensor, got {xs[0].dtype}")
    return [(xs[0].shape, xs[0].dtype)]


scale_shift = testext.op(
    "scale_shift",
    arity=1,
    attrs={"scale": 2.0, "shift": 0.0},
    infer=_same,
    grad=lambda b, g, xs, out, a: (g * a["scale"],),
    kernels={"cpu": lambda x, scale, shift: x * scale + shift},
    doc="x * scale + shift",
)

snap = testext.op(
    "snap",
    arity=1,
    infer=_same,
    grad=NOT_DIFFERENTIABLE,
    kernels={"cpu": lambda x: np.round(x)},
    doc="Round to the nearest integer; deliberately not differentiable.",
)
