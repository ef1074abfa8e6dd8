"""The digits MLP trains to >= 95% test accuracy on the embedded CPU device."""

from __future__ import annotations

import os
import sys

import burn_remote as br

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import digits  # noqa: E402


def test_digits_mlp_reaches_95_percent():
    dev = br.Device.cpu()
    before = dev.stats()["graphs_registered"]
    _, losses, acc = digits.train(dev, epochs=12)
    assert losses[-1] < losses[0] / 4
    assert acc >= 0.95, f"test accuracy {acc:.3f}"
    # every step has the same structure: a handful of graphs (first step, steady step,
    # evaluation), not one per step
    assert dev.stats()["graphs_registered"] - before <= 4
