"""The server's logs and counters as an operator reads them: JSON mode stays JSON when a peer
is refused (aioquic's own warnings included), each refusal is one structured event, a user's
bad job is one WARNING line, one failure counts once, and an idle loop shows no lag."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from burn_remote import OpFailed, RemoteDevice, RemoteError
from burn_remote import functional as F
from burn_remote.protocol.transport import Identity
from burn_remote.server import _status
from burn_remote.server.jobs import JobService
from burn_remote.server.testing import start_daemon

from tests.jobs.models import make_base

EXE = Path(sys.executable).with_name("burn-remote")


def test_json_logs_stay_json_when_a_peer_is_refused(tmp_path: Path) -> None:
    peers = tmp_path / "authorized_peers"
    peers.write_text(f"{Identity.generate().peer_id}\n")  # not the client below
    err = tmp_path / "stderr"
    with open(err, "w") as stderr:
        proc = subprocess.Popen(
            [str(EXE), "serve", "--data-dir", str(tmp_path / "srv"), "--listen",
             "127.0.0.1:0", "--log-format", "json", "--authorized-peers", str(peers)],
            stdout=subprocess.PIPE, stderr=stderr, text=True,
        )  # fmt: skip
        try:
            target = None
            for line in proc.stdout:  # type: ignore[union-attr]
                if line.startswith("connect with: "):
                    target = line.split("'")[1]
                    break
            assert target is not None
            client_key = tmp_path / "client-key"
            stranger = Identity.load_or_create(client_key).peer_id
            with pytest.raises(RemoteError, match="not in this server's authorized peers"):
                RemoteDevice(target, key=client_key).tensor([1.0]).numpy()
            time.sleep(0.5)  # the server's side of the close is logged too
        finally:
            proc.terminate()
            proc.wait(30)
    records = [json.loads(line) for line in err.read_text().splitlines() if line.strip()]
    refused = [r for r in records if r.get("event") == "peer_refused"]
    assert len(refused) == 1, records
    assert refused[0]["peer"] == str(stranger) and refused[0]["level"] == "warning"
    assert refused[0]["address"].startswith("127.0.0.1:")


def test_one_failure_is_counted_once(tmp_path: Path) -> None:
    srv = start_daemon("serve", tmp_path / "srv", "--allow-any", "--http", "127.0.0.1:0")
    try:
        dev = RemoteDevice(srv.target)
        x = dev.tensor(np.ones((3, 4), np.float32))
        bad = F.index_select(x, dev.tensor(np.array([0, 7], np.int64)), axis=0)
        with pytest.raises(OpFailed, match="out of bounds"):
            bad.numpy()
        assert dev.tensor([2.0]).item() == 2.0  # the session goes on
        metrics = urllib.request.urlopen(srv.http.rstrip("/") + "/metrics", timeout=30).read()
        counted = [
            line
            for line in metrics.decode().splitlines()
            if line.startswith("burn_remote_errors_total{")
        ]
        assert counted == ['burn_remote_errors_total{kind="execution"} 1.0'], counted
    finally:
        srv.stop()


def test_an_idle_loop_reports_no_lag() -> None:
    """The time since the last tick (up to HEARTBEAT) is not lag; a late tick is."""
    now = time.monotonic()
    idle = SimpleNamespace(heartbeat=now - 0.4, loop_lag=0.002, sessions={}, started=now - 9,
                           jobs=None)  # fmt: skip
    assert _status.health(idle)[1]["loop_lag_s"] == 0.002
    stuck = SimpleNamespace(heartbeat=now - 2.5, loop_lag=0.0, sessions={}, started=now - 9,
                            jobs=None)  # fmt: skip
    ok, body = _status.health(stuck)
    assert ok and body["loop_lag_s"] >= 1.9  # overdue by 2.5 - HEARTBEAT


def test_a_users_bad_job_is_one_warning_line(tmp_path: Path, caplog) -> None:
    weights, _ = make_base(tmp_path)
    service = JobService(tmp_path / "data")
    try:
        ref = "sha256:" + service.store.put_artifact(weights.read_bytes())
        caplog.set_level(logging.INFO, logger="burn_remote")
        spec = {"kind": "onnx_export", "model": {"weights": ref}, "example_shape": [1, 64]}
        job = service.submit(spec)  # 64 tokens for a model of context 16: the run refuses
        deadline = time.monotonic() + 60
        while service.status(job["id"])["state"] not in ("failed", "succeeded"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert service.status(job["id"])["state"] == "failed"
    finally:
        service.close()
    failed = [r for r in caplog.records if getattr(r, "event", None) == "job_failed"]
    assert len(failed) == 1 and failed[0].levelno == logging.WARNING, failed
    assert failed[0].exc_info is None and "context" in failed[0].getMessage()


def test_an_idle_relay_reports_no_lag() -> None:
    from burn_remote.server._http import relay_health

    beat = SimpleNamespace(last=time.monotonic() - 0.4, lag=0.001)
    assert relay_health(None, beat)()[1]["loop_lag_s"] == 0.001
