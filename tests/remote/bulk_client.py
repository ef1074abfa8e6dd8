"""A client process for the big round-trip test: uploads N MiB, computes, reads it back and
checks every value, then prints its peak RSS above its baseline (one JSON line).

Run as ``python bulk_client.py TARGET KEY MIB``. The values are small integers (exact in
float32), regenerated in slices for the check, so the process holds no second copy."""

from __future__ import annotations

import json
import sys

import numpy as np
from burn_remote import RemoteDevice

PERIOD = 65521
STEP = 4 * 2**20


def status(field: str) -> int:
    """A /proc/self/status memory field in bytes (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def pattern(start: int, stop: int) -> np.ndarray:
    return (np.arange(start, stop, dtype=np.int64) % PERIOD).astype(np.float32)


def main() -> None:
    target, key, mib = sys.argv[1], sys.argv[2], int(sys.argv[3])
    dev = RemoteDevice(target, key=key)
    assert dev.tensor(np.ones(4, np.float32)).sum().item() == 4.0  # connected, all imported
    base = status("VmRSS")
    n = mib * 2**20 // 4
    x = np.empty(n, np.float32)
    for i in range(0, n, STEP):
        x[i : i + STEP] = pattern(i, min(n, i + STEP))
    t = dev.tensor(x)
    del x
    y = t * 3.0
    del t
    r = y.numpy()
    for i in range(0, n, STEP):
        if not np.array_equal(r[i : i + STEP], pattern(i, min(n, i + STEP)) * 3.0):
            raise SystemExit(f"wrong values in [{i}, {i + STEP})")
    print(json.dumps({"base": base, "hwm": status("VmHWM"), "bytes": n * 4}), flush=True)
    dev.close()


if __name__ == "__main__":
    main()
