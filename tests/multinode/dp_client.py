"""The client side of the data-parallel namespace test, run in the client's namespace.

Usage: python dp_client.py TARGET1 TARGET2 TARGET3   (each PEER@HOST:PORT)

1. Trains the digits MLP and the tiny GPT with LoRA data-parallel on the first 2 and on all 3
   servers, and the same on one server with the whole batch; reports the largest difference.
2. Starts a 3-server training, prints ``KILL <rank>`` and waits for a line on stdin (the test
   freezes that server, as a machine that loses power: no packet from it, not even a
   refusal), goes on training, reports what every survivor raised and when, prints
   ``SEEN`` (the test then kills the frozen process), rebuilds on the survivors, finishes,
   and reports the difference to one server.
Prints one ``RESULT {json}`` line at the end.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VICTIM = 2
BATCH, STEPS, FAIL_AT = 12, 10, 4


def diff(a: dict, b: dict) -> float:
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k]))) for k in a)


def main() -> None:
    from burn_remote import DataParallel, RemoteDevice, collective
    from support.dp_models import MODELS, mlp, train_one, train_parallel

    devices = [RemoteDevice(t) for t in sys.argv[1:4]]
    out: dict = {"equal": {}}
    for kind, build in sorted(MODELS.items()):
        want, want_losses = train_one(devices[0], build, BATCH, 6)
        for n in (2, 3):
            got, losses, dp = train_parallel(devices[:n], build, BATCH, 6)
            dp.check_in_sync()
            out["equal"][f"{kind}-{n}"] = {
                "max_abs_diff": diff(got, want),
                "loss_diff": max(abs(a - b) for a, b in zip(losses, want_losses)),
                "moved": diff(got, train_one(devices[0], build, BATCH, 1)[0]),
            }
            dp.close()
    want, _ = train_one(devices[0], mlp, BATCH, STEPS)
    model, opt, step, batches = mlp(BATCH, STEPS)
    dp = DataParallel(model, opt, devices=devices)
    run = dp.compile(step)
    for x, y in batches[:FAIL_AT]:
        run(x, y)
    dp.sync()
    print(f"KILL {VICTIM}", flush=True)
    sys.stdin.readline()
    t0 = time.monotonic()
    try:
        for x, y in batches[FAIL_AT:]:
            run(x, y)
        dp.sync()
        out["fault"] = {"raised": None}
    except collective.GroupError as exc:
        failure = dp.last_failure
        out["fault"] = {
            "raised": str(exc),
            "seconds": time.monotonic() - t0,
            "rank": exc.rank,
            "peer": exc.peer,
            "dead": sorted(failure.dead),
            "survivors_saw": {
                str(r): [type(e).__name__, getattr(e, "rank", None)]
                for r, e in failure.errors.items()
            },
        }
        print("SEEN", flush=True)
        dp.rebuild()
        out["fault"]["resumed_at"] = dp.steps
        out["fault"]["devices_after"] = len(dp.devices)
        for x, y in batches[dp.steps :]:
            run(x, y)
        dp.check_in_sync()
        out["fault"]["max_abs_diff"] = diff(dp.state_dict(), want)
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
