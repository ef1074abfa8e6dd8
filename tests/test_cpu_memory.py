"""The CPU engine's malloc settings (engine/backends/cpu_memory.py): freed intermediate arrays
are reused instead of being page-faulted in anew, the kept memory goes back to the kernel on
``release_freed_memory``, and ``BURN_REMOTE_KEEP_FREED=0`` leaves malloc as it was.

Each case runs in a fresh interpreter: the settings are the whole process's. The oracle is
the kernel's own count of minor page faults and the resident set (/proc/self/status)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    not os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"), reason="the settings are glibc's"
)


SCRIPT = r"""
import json, resource, numpy as np
import burn_remote as br
br.Device.cpu()  # makes the CPU backend, which applies the settings
from burn_remote.engine.backends import cpu_memory

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

x = np.ones(3 * 2**20 // 4, np.float32)

def step():  # a step's intermediates: 20 fresh 3 MiB results alive at once, then dropped
    live = [x + i for i in range(20)]
    del live

step()  # warm: the first blocks of this size
before = faults()
for _ in range(10):
    step()
steady = faults() - before
held = [x + i for i in range(100)]  # 300 MiB of intermediates, then all dropped
base = rss()
del held
kept = rss()
cpu_memory.release_freed_memory()
print(json.dumps({"faults": steady, "base": base, "kept": kept, "released": rss(),
                  "on": cpu_memory._state["kept"]}))
"""


def _run(keep: str) -> dict:
    env = dict(os.environ, BURN_REMOTE_KEEP_FREED=keep)
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_freed_arrays_are_reused_without_page_faults_and_released_on_request() -> None:
    got = _run("1")
    assert got["on"]
    pages = 3 * 2**20 // 4096
    assert got["faults"] < pages  # 200 new 3 MiB arrays: not one array's pages faulted in
    assert got["kept"] > got["base"] - 100 * 2**20  # dropped, yet kept for the next arrays
    assert got["released"] < got["kept"] - 200 * 2**20  # handed back on request


def _huge_pages_always() -> bool:
    """Transparent huge pages on for every mapping: a fresh 3 MiB array then faults a page
    or two, not 768, and the count no longer tells the two settings apart."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[always]" in f.read()
    except OSError:
        return False


def test_the_setting_can_be_turned_off() -> None:
    got = _run("0")
    assert not got["on"]
    if _huge_pages_always():
        pytest.skip("transparent huge pages [always]: faults do not count 4 KiB pages")
    pages = 3 * 2**20 // 4096
    assert got["faults"] > 100 * pages  # glibc's defaults: a new array faults its pages in


KEPT_SCRIPT = r"""
import json, numpy as np
import burn_remote as br
br.Device.cpu()
from burn_remote.engine.backends import cpu_memory

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

held = [np.full(3 * 2**20 // 4, i, np.float32) for i in range(100)]  # 300 MiB, then dropped
del held
kept, free = rss(), cpu_memory.kept_free_bytes()
above = cpu_memory.release_kept_above(2**40)  # more than it keeps: nothing happens
same = rss()
freed = cpu_memory.release_kept_above(64 * 2**20)
print(json.dumps({"kept": kept, "free": free, "above": above, "same": same, "freed": freed,
                  "after": rss(), "free_after": cpu_memory.kept_free_bytes()}))
"""


def test_kept_memory_is_released_only_above_the_bound() -> None:
    """``release_kept_above``: the free heap memory malloc reports (mallinfo2) is what a
    dropped 300 MiB left, nothing is released below the bound, and above it the RSS falls."""
    env = dict(os.environ, BURN_REMOTE_KEEP_FREED="1")
    out = subprocess.run(
        [sys.executable, "-c", KEPT_SCRIPT], env=env, capture_output=True, text=True, check=True
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["free"] >= 250 * 2**20
    assert got["above"] == 0 and got["same"] > got["kept"] - 50 * 2**20
    assert got["freed"] >= 200 * 2**20  # what the resident set shrank by
    assert got["after"] < got["kept"] - 200 * 2**20
    assert got["free_after"] < got["free"]


def test_the_server_keeps_what_its_recent_plans_need() -> None:
    """The arena a server lets malloc keep counts the largest plan arena of this check's
    window and the one before, then forgets it."""
    from burn_remote.server._state import ServerState

    state = ServerState("cpu")
    state.note_arena(100)
    state.note_arena(40)
    assert state.take_arena_need() == 100
    state.note_arena(10)
    assert state.take_arena_need() == 100  # the step just before the check still counts
    assert state.take_arena_need() == 10
    assert state.take_arena_need() == 0
