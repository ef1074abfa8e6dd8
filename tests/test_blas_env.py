"""``import burn_remote`` tells OpenBLAS not to keep idle threads spinning (client/_blas_env.py):
only when NumPy is not loaded yet and the user has not chosen a value. Each case is a fresh
interpreter, as OpenBLAS reads the setting once, when NumPy loads it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ENV = "OPENBLAS_THREAD_TIMEOUT"


def _seen(first: str, preset: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if preset is not None:
        env[ENV] = preset
    code = f"import {first}, burn_remote, os; print(os.environ.get({ENV!r}, 'unset'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize(
    "first,preset,want",
    [
        ("os", None, "16"),  # burn_remote first: set before NumPy loads OpenBLAS
        ("numpy", None, "unset"),  # NumPy first: too late to matter, so left alone
        ("os", "8", "8"),  # the user's own value wins
    ],
)
def test_the_blas_spin_is_set_only_before_numpy_and_never_over_the_users(first, preset, want):
    assert _seen(first, preset) == want


def test_numpy_loaded_after_the_setting_runs_its_products_with_it() -> None:
    code = (
        "import burn_remote, numpy as np; a = np.ones((256, 256), np.float32);"
        "print(float((a @ a)[0, 0]))"
    )
    env = {k: v for k, v in os.environ.items() if k != ENV}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "256.0", out.stderr
