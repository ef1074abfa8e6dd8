"""Against a real `burn-remote serve` subprocess on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from burn_remote import Device, OpFailed, RemoteDevice, RemoteError
from burn_remote import functional as F

from tests.transport.conftest import streams_left

from .conftest import Server, env_with_home
from .mlp import train

pytestmark = pytest.mark.timeout(300)


def test_mlp_bitwise_equal_and_one_small_message_per_step(server: Server) -> None:
    dev = RemoteDevice(server.target)
    seen = []
    remote = train(dev, 5, on_step=lambda step, data: seen.append((dev.stats(), data)))
    local = train(Device.cpu(), 5)
    assert remote["losses"] == local["losses"]
    for a, b in zip(remote["weights"], local["weights"]):
        assert a.tobytes() == b.tobytes()
    for (before, _), (after, data) in zip(seen[1:], seen[2:]):
        assert after["messages_sent"] - before["messages_sent"] == 1
        assert after["bytes_sent"] - before["bytes_sent"] - data <= 1024
        assert after["replays"] - before["replays"] == 1
    dev.close()


def test_server_error_surfaces_at_sync_and_session_goes_on(server: Server) -> None:
    dev = RemoteDevice(server.target)
    a = dev.tensor(np.arange(4, dtype=np.float32))
    bad = F.index_select(a, dev.tensor(np.array([9])))
    line = sys._getframe().f_lineno - 1
    with pytest.raises(OpFailed, match=rf"index_select \(recorded at .*test_serve.py:{line}\)"):
        dev.sync()  # `bad` is still held: an op nobody holds would be dropped, not run
    del bad
    assert (a * 2).sum().item() == 12.0
    dev.close()


def test_two_clients_are_isolated(server: Server, tmp_path: Path) -> None:
    one = RemoteDevice(server.target)
    two = RemoteDevice(server.target, key=tmp_path / "second-key")
    assert one is not two
    x1 = one.tensor(np.full(3, 1.0, np.float32))  # both get tensor id 1
    x2 = two.tensor(np.full(3, 2.0, np.float32))
    assert x1._id == x2._id
    assert x1.sum().item() == 3.0 and x2.sum().item() == 6.0
    only_one = one.tensor(np.zeros(5, np.float32))
    only_one.sum().item()
    assert one.session_stats()["session_tensors"] == two.session_stats()["session_tensors"] + 1
    one.close()
    two.close()


def test_a_long_step_runs_off_the_network_loop(server: Server, tmp_path: Path) -> None:
    """Small timed steps may run on the loop (see Handler.inline); a long one must not
    hold up another session's reads."""
    slow = RemoteDevice(server.target)
    quick = RemoteDevice(server.target, key=tmp_path / "quick-key")
    x = quick.tensor(np.ones(4, np.float32))
    assert x.sum().item() == 4.0
    big = slow.tensor(np.full((1500, 1500), 1e-3, np.float32))
    slow.sync()  # its 9 MB are on the server: what follows is engine work only
    y = big
    for _ in range(40):  # about a second of matmuls on this machine
        y = y @ big
    done = threading.Event()
    worker = threading.Thread(target=lambda: (y.sum().item(), done.set()))
    worker.start()
    time.sleep(0.3)  # let the slow step reach the server
    for _ in range(5):
        assert (x * 2).sum().item() == 8.0
    assert not done.is_set(), "the slow step ended first: make it longer"
    worker.join(120)
    assert done.is_set()
    slow.close()
    quick.close()


def test_server_to_server_move(spawn) -> None:  # type: ignore[no-untyped-def]
    a_srv, b_srv = spawn(), spawn()
    b_srv.know(a_srv)  # b dials a at the address in its own book, never one from the client
    a, b = RemoteDevice(a_srv.target), RemoteDevice(b_srv.target)
    data = np.arange(300_000, dtype=np.float32)  # 1.2 MB: bulk on the server-to-server leg
    t = a.tensor(data) * 2
    before = b.stats()
    moved = t.to(b)
    assert moved.device is b
    got = (moved + 1).numpy()
    np.testing.assert_array_equal(got, data * 2 + 1)
    after = b.stats()
    assert after["data_bytes_sent"] == before["data_bytes_sent"]  # the client never sent it
    assert a.stats()["data_bytes_received"] == 0
    a.close()
    b.close()


CLIENT = """
import numpy as np, sys, time
from burn_remote import RemoteDevice
dev = RemoteDevice(sys.argv[1])
keep = dev.tensor(np.ones(1_000_000, np.float32)) * 3
keep.sum().item()
print("ready", flush=True)
sys.stdin.readline()  # the test says when to end (no dev.close())
"""


@pytest.mark.parametrize("ending", ["killed", "exits without close"])
def test_a_gone_clients_tensors_are_freed(spawn, tmp_path: Path, ending: str) -> None:  # type: ignore[no-untyped-def]
    """A program that ends says goodbye (atexit) and the session is freed at once; a killed
    one cannot: the server notices the silence (idle timeout), keeps the session for the
    resume grace period, then frees it."""
    killed = ending == "killed"
    srv = spawn(*(("--idle-timeout", "2", "--resume-grace", "1") if killed else ()))
    home = tmp_path / "client-home-2"
    home.mkdir(mode=0o700)
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(CLIENT), srv.target],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env_with_home(home),
    )
    try:
        assert proc.stdout.readline().split() == ["ready"]
        watcher = RemoteDevice(srv.target)
        stats = watcher.session_stats()
        assert stats["sessions"] == 2 and stats["server_bytes"] >= 4_000_000
        if killed:
            proc.kill()
        else:
            proc.stdin.write("end\n")
            proc.stdin.flush()
        assert proc.wait(30) != 0 if killed else proc.wait(30) == 0
        # Killed: 2 s idle timeout + 1 s grace. Ended: long before the defaults (30 s + 30 s).
        deadline = time.monotonic() + (60 if killed else 10)
        while time.monotonic() < deadline:
            stats = watcher.session_stats()
            if stats["sessions"] == 1:
                break
            time.sleep(0.2)
        assert stats["sessions"] == 1
        assert stats["server_bytes"] == stats["session_bytes"] == 0
        watcher.close()
    finally:
        proc.kill()


def test_remote_memory_stats_has_the_local_form(server: Server) -> None:
    dev = RemoteDevice(server.target)
    x = dev.tensor(np.ones(1000, np.float32))
    stats = dev.memory_stats()
    rows = {p.name: p for p in stats.pools}
    assert rows["session"].in_use == 4000 and rows["session"].peak_in_use >= 4000
    assert stats.in_use >= 4000 and stats.peak_in_use >= stats.in_use
    assert "memory on remote:" in str(stats)
    del x
    dev.close()


def test_bulk_streams_are_freed_at_both_ends(server: Server) -> None:
    """Each large upload and read has a stream of its own; both ends finish it, so neither
    side's QUIC keeps one per tensor (a growing stream table slows every packet built)."""
    dev = RemoteDevice(server.target)
    big = np.arange(100_000, dtype=np.float32)  # 400 KB: above the bulk threshold
    for k in range(5):
        t = dev.tensor(big + k)
        np.testing.assert_array_equal(t.numpy(), big + k)  # up and back down, bulk both ways
    link = dev._rt.link
    assert streams_left(link._conn, link._control, dev.sync) == [link._control]
    dev.close()


def test_a_forked_child_cannot_use_or_end_its_parents_session(server: Server) -> None:
    """The child inherits the connection (keys, packet numbers) but not its threads, and its
    atexit handlers: using the device there fails clearly, and exiting says no goodbye for
    the parent."""
    dev = RemoteDevice(server.target)
    x = dev.tensor(np.arange(3, dtype=np.float32))
    assert x.sum().item() == 3.0
    pid = os.fork()
    if pid == 0:  # the child: report through the exit status, never return into pytest
        code = 1
        try:
            (x * 2).sum().item()
        except RemoteError as exc:
            code = 0 if "fork" in str(exc) else 2
        except BaseException:
            code = 3
        import atexit

        atexit._run_exitfuncs()  # what a normal exit runs
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (x * 2).sum().item() == 6.0  # the parent's session is untouched
    dev.close()
