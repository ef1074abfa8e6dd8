"""The compose runner's command: the multi-node suite in three pytest processes at once, so
the fault cases' waiting (10 s pause, 10 s disconnect, a job killed and restarted) overlaps.

* s1's faults (pause, packet loss) with the suite against the compose services;
* s2's and s3's faults (network disconnect, kill and restart mid-job);
* the network-namespace suite inside this container (``BURN_REMOTE_LAB=netns``).

Each group's report is printed whole when it ends; the exit status is 0 only if all pass.
Usage (in the runner container): python tests/multinode/run_groups.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from contextlib import ExitStack

PYTEST = [sys.executable, "-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider"]
NETNS = "tests/multinode/test_netns.py"
FAULTS = "tests/multinode/test_compose_faults.py"
GROUPS: dict[str, tuple[list[str], dict[str, str]]] = {
    "compose suite, s1 faults": ([NETNS, FAULTS, "-k", "not disconnected and not killed"], {}),
    "compose suite, s2 and s3 faults": ([FAULTS, "-k", "disconnected or killed"], {}),
    "network-namespace suite in this container": ([NETNS], {"BURN_REMOTE_LAB": "netns"}),
}


def main() -> int:
    status = 0
    with ExitStack() as files:
        running = []
        for name, (args, env) in GROUPS.items():
            out = files.enter_context(tempfile.TemporaryFile(mode="w+"))
            home = files.enter_context(tempfile.TemporaryDirectory())  # a key per process
            proc = subprocess.Popen(
                [*PYTEST, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "BURN_REMOTE_HOME": home, **env},
            )
            running.append((name, proc, out))
        for name, proc, out in running:
            code = proc.wait()
            out.seek(0)
            print(f"==== {name}: exit {code} ====\n{out.read()}", flush=True)
            status = status or code
    return status


if __name__ == "__main__":
    sys.exit(main())
