"""scikit-learn's 8x8 digits standing in for MNIST (no download): NCHW float32, normalised
like torchvision's MNIST transform, int64 labels; the same split for both scripts."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import digits  # noqa: E402


def load_arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    x_train, y_train, x_test, y_test = digits.load(seed=0)
    mean, std = x_train.mean(), x_train.std()
    prep = lambda x: ((x - mean) / std).reshape(-1, 1, 8, 8).astype(np.float32)  # noqa: E731
    return prep(x_train), y_train, prep(x_test), y_test
