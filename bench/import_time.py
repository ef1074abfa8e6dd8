"""`import burn_remote` next to `import numpy`: medians over fresh interpreters.

    python bench/import_time.py [runs]

Each run starts a new interpreter that times `import numpy`, then `import burn_remote` on
top (what the package adds: the goal is at most 30 ms). Runs alternate with interpreters
that import NumPy only, so the totals compare side by side under the same machine load.
Bytecode caches are written first (a warm-up run without PYTHONDONTWRITEBYTECODE), as a
user's installed package has them; a loaded machine scales every figure, so read the
ratio to NumPy's own import as well.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys

TIMER = (
    "import time; t0 = time.perf_counter(); import numpy; t1 = time.perf_counter(); {extra}; "
    "t2 = time.perf_counter(); print(t1 - t0, t2 - t1, t2 - t0)"
)
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _run(extra: str) -> list[float]:
    out = subprocess.run(
        [sys.executable, "-c", TIMER.format(extra=extra)],
        capture_output=True,
        text=True,
        env=ENV,
        check=True,
    )
    return [float(x) for x in out.stdout.split()]


def main(runs: int = 21) -> None:
    _run("import burn_remote")  # writes the bytecode caches
    plain, ours = [], []
    for _ in range(runs):
        plain.append(_run("pass"))
        ours.append(_run("import burn_remote"))
    med = lambda rows, k: statistics.median(r[k] for r in rows) * 1e3  # noqa: E731
    numpy_ms, added_ms = med(ours, 0), med(ours, 1)
    print(f"import numpy                          median {numpy_ms:7.1f} ms ({runs} interpreters)")
    print(f"import burn_remote after numpy        median {added_ms:7.1f} ms "
          f"({added_ms / numpy_ms:.2f} x numpy's; goal <= 30 ms)")  # fmt: skip
    print(f"whole interpreter, numpy only         median {med(plain, 2):7.1f} ms")
    print(f"whole interpreter, numpy+burn_remote  median {med(ours, 2):7.1f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 21)
