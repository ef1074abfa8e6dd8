"""`server.testing.start_daemon` reads the banner from stdout alone, line by line.

A server that resumes a job at start-up logs while it prints its banner; with stdout and
stderr on one pipe a log line once landed inside the "peer id:" line. A stand-in daemon
(run through `prefix`, so the real parsing path is used) writes log text to stderr before,
inside and after its banner, including a line that looks like a banner line.
"""

from __future__ import annotations

import sys
import textwrap

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
