"""`make demo`: the main job, end to end, on the embedded CPU default."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import burn_remote as br  # noqa: E402
import digits  # noqa: E402


def main() -> None:
    dev = br.Device.cpu()
    print("== 1. digits MLP on Device.cpu() ==")
    _, losses, acc = digits.train(dev, progress=True)
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}; test accuracy {acc:.1%}")
    stats = dev.stats()
    print(f"graphs registered {stats['graphs_registered']}, graph runs {stats['replays']}")


if __name__ == "__main__":
    main()
