"""`server.testing.start_daemon` reads the banner from stdout alone, line by line.

A server that resumes a job at start-up logs while it prints its banner; with stdout and
stderr on one pipe a log line once landed inside the "peer id:" line. A stand-in daemon
(run through `prefix`, so the real parsing path is used) writes log text to stderr before,
inside and after its banner, including a line that looks like a banner line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from burn_remote.server.testing import start_daemon

PEER = "k51qzi5uqu5dtrueone"

FAKE = textwrap.dedent(
    f"""
    import signal, sys, time
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    err, out = sys.stderr, sys.stdout
    err.write("INFO job 1: resuming from the checkpoint at step 10 ... "); err.flush()
    out.write("burn-remote serve: device cpu\\n"); out.flush()
    out.write("peer id: {PEER}"); out.flush()
    err.write("still resuming\\npeer id: k51qzi5uqu5dnotthisone\\n"); err.flush()
    out.write("\\nlistening on: 127.0.0.1:4433\\n"); out.flush()
    err.write("listening on: 10.9.9.9:1\\n"); err.flush()
    out.write("http: http://127.0.0.1:9090 (/healthz, /metrics)\\n")
    err.write("INFO job 1: step 11\\n"); err.flush()
    out.write("connect with: RemoteDevice('{PEER}@127.0.0.1:4433')\\n"); out.flush()
    while True:
        time.sleep(0.1)
    """
)


def test_the_banner_comes_from_stdout_whatever_the_logs_print(tmp_path):
    script = tmp_path / "fake_serve.py"
    script.write_text(FAKE)
    daemon = start_daemon("serve", tmp_path / "d", prefix=[sys.executable, str(script)])
    try:
        assert daemon.peer_id == PEER
        assert daemon.address == "127.0.0.1:4433"
        assert daemon.http == "http://127.0.0.1:9090"
    finally:
        assert daemon.stop() == 0
    text = daemon.output()  # both streams are kept for tests that read the logs
    assert "INFO job 1: step 11" in text and "still resuming" in text
    assert f"connect with: RemoteDevice('{PEER}@127.0.0.1:4433')" in text


def test_a_daemon_that_exits_before_its_banner_is_reported_with_its_output(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("import sys\nsys.stderr.write('cannot listen: in use\\n')\nsys.exit(2)\n")
    try:
        start_daemon("serve", tmp_path / "d", prefix=[sys.executable, str(script)])
    except RuntimeError as exc:
        assert "did not start" in str(exc) and "cannot listen: in use" in str(exc)
    else:
        raise AssertionError("start_daemon returned for a daemon that exited")


PARENT = textwrap.dedent(
    """
    import sys, threading
    from burn_remote.server.testing import start_daemon, start_server
    if sys.argv[2] == "thread":  # started on a worker thread that then ends
        box = []
        t = threading.Thread(target=lambda: box.append(start_server(sys.argv[1])))
        t.start(); t.join()
        daemon = box[0]
    else:
        daemon = start_server(sys.argv[1])
    print(daemon.proc.pid, flush=True)
    threading.Event().wait()  # until killed
    """
)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _wait_gone(pid: int, seconds: float) -> bool:
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return not _alive(pid)


def _start_parent(tmp_path, where: str) -> tuple[subprocess.Popen, int]:
    """A process running PARENT (starting its server on the ``main`` thread or a
    ``thread``), and its server's pid."""
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "d"), where], stdout=subprocess.PIPE, text=True
    )
    return parent, int(parent.stdout.readline())


@pytest.mark.skipif(sys.platform != "linux", reason="prctl(PR_SET_PDEATHSIG) is Linux's")
def test_a_daemon_ends_with_the_process_that_started_it(tmp_path):
    """A test run killed outright (SIGKILL: no fixture teardown) leaves no server behind."""
    parent, server = _start_parent(tmp_path, "main")
    try:
        assert _alive(server)
        parent.kill()
        parent.wait()
        assert _wait_gone(server, 30), "the server outlived the process that started it"
    finally:
        if _alive(server):
            os.kill(server, signal.SIGKILL)


@pytest.mark.skipif(sys.platform != "linux", reason="prctl(PR_SET_PDEATHSIG) is Linux's")
def test_a_daemon_started_on_a_thread_outlives_that_thread(tmp_path):
    """The kernel's parent-death signal follows the forking *thread*: a daemon started on a
    worker thread is not armed, so it keeps serving after that thread ends."""
    parent, server = _start_parent(tmp_path, "thread")
    try:
        assert not _wait_gone(server, 1.0), "the daemon died with the thread that started it"
    finally:
        parent.kill()
        parent.wait()
        os.kill(server, signal.SIGTERM)
        _wait_gone(server, 30)
