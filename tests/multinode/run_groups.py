"""The compose runner's command: the multi-node suite in pytest processes that overlap where
they can, so the fault cases' waiting (10 s pause, 10 s disconnect, a job killed and
restarted) overlaps.

* the network-namespace suite inside this container (``BURN_REMOTE_LAB=netns``) runs from
  start to end beside everything else: it touches none of the compose services;
* first, the suite against the compose services (``test_netns.py``) runs alone against them;
* then s1's faults (pause, packet loss) and s2's and s3's faults (network disconnect, kill and
  restart mid-job) run at once.

The suite against the services must not share its time with the fault cases: it moves a
tensor from s2, and a disconnect of s2 landing during that move made the move's handshake
time out (s2, back on the network, then logged the client's CONNECTION_CLOSE as "Packet
contains no CRYPTO frame": the first packet of that connection it ever saw).

Each group's report is printed whole when it ends; the exit status is 0 only if all pass.
Usage (in the runner container): python tests/multinode/run_groups.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from typing import IO

PYTEST = [sys.executable, "-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider"]
NETNS = "tests/multinode/test_netns.py"
FAULTS = "tests/multinode/test_compose_faults.py"
Group = tuple[str, list[str], dict[str, str]]
BESIDE: Group = ("network-namespace suite in this container", [NETNS], {"BURN_REMOTE_LAB": "netns"})
PHASES: list[list[Group]] = [
    [("compose suite", [NETNS], {})],
    [
        ("compose faults, s1", [FAULTS, "-k", "not disconnected and not killed"], {}),
        ("compose faults, s2 and s3", [FAULTS, "-k", "disconnected or killed"], {}),
    ],
]
"""Groups of one phase run at once; a phase starts when the one before it ended."""


def main() -> int:
    with ExitStack() as files:

        def start(group: Group) -> tuple[str, subprocess.Popen, IO[str]]:
            name, args, env = group
            out = files.enter_context(tempfile.TemporaryFile(mode="w+"))
            home = files.enter_context(tempfile.TemporaryDirectory())  # a key per process
            proc = subprocess.Popen(
                [*PYTEST, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "BURN_REMOTE_HOME": home, **env},
            )
            return name, proc, out

        def finish(running: list[tuple[str, subprocess.Popen, IO[str]]]) -> int:
            status = 0
            for name, proc, out in running:
                code = proc.wait()
                out.seek(0)
                print(f"==== {name}: exit {code} ====\n{out.read()}", flush=True)
                status = status or code
            return status

        beside = start(BESIDE)
        status = 0
        for phase in PHASES:
            status = finish([start(group) for group in phase]) or status
        return finish([beside]) or status


if __name__ == "__main__":
    sys.exit(main())
