"""The operator's view of a real server: structured logs, /healthz, Prometheus /metrics
(scraped with prometheus_client's own parser), `burn-remote status` for admins only, and the
CLI's --version, human sizes and refusals."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from burn_remote import OpFailed, RemoteDevice
from burn_remote.protocol.transport import Identity, default_key_path
from burn_remote.server.testing import start_daemon, start_server

from tests.remote.conftest import env_with_home

# a dependency of the package (pyproject); a worktree whose venv predates it skips
text_string_to_metric_families = pytest.importorskip(
    "prometheus_client.parser"
).text_string_to_metric_families

EXE = str(Path(sys.executable).with_name("burn-remote"))


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _metrics(server) -> dict[str, list]:  # type: ignore[no-untyped-def]
    status, text = _get(server.http + "/metrics")
    assert status == 200
    return {
        f.name: [(s.name, s.labels, s.value) for s in f.samples]
        for f in text_string_to_metric_families(text)
    }


def _value(metrics, family, **labels):  # type: ignore[no-untyped-def]
    for name, got, value in metrics[family]:
        if all(got.get(k) == v for k, v in labels.items()) and not name.endswith("_created"):
            return value
    raise KeyError(f"{family} {labels}")


def _compose_healthcheck(http: str) -> list[str]:
    """docker-compose.yml's server health check, pointed at ``http`` and run here."""
    yaml = pytest.importorskip("yaml")
    root = Path(__file__).resolve().parents[2]
    doc = yaml.safe_load((root / "docker-compose.yml").read_text())
    test = doc["services"]["s1"]["healthcheck"]["test"]
    assert test[0] == "CMD" and test[1] == "python"
    return [sys.executable, *(a.replace("http://127.0.0.1:9100", http) for a in test[2:])]


def _cli(*args: str, home: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [EXE, *args], capture_output=True, text=True, env=env_with_home(home), timeout=60
    )


def test_logs_health_metrics_and_status(tmp_path: Path, client_home: Path) -> None:
    data = tmp_path / "server"
    server = start_server(
        data, "--http", "127.0.0.1:0", "--log-format", "json", "--memory-limit", "1G"
    )
    try:
        assert server.http and server.http.startswith("http://127.0.0.1:")
        banner = server.output()
        assert "auth: open: any authenticated peer is admitted (--allow-any)" in banner
        assert f"data dir: {data} (jobs on)" in banner

        status, body = _get(server.http + "/healthz")
        assert status == 200 and json.loads(body)["status"] == "ok"
        check = _compose_healthcheck(server.http)  # what docker-compose runs, as written
        assert subprocess.run(check, capture_output=True, timeout=30).returncode == 0

        dev = RemoteDevice(server.target)
        dev_peer = Identity.load_or_create(default_key_path()).peer_id
        x = dev.tensor(np.ones(1000, np.float32))
        for k in range(5):
            assert (x * k).sum().item() == 1000.0 * k
        with pytest.raises(OpFailed, match="FORBIDDEN|admins"):
            dev.server_status()  # an ordinary peer is not an admin
        metrics = _metrics(server)
        assert _value(metrics, "burn_remote_sessions") == 1
        assert _value(metrics, "burn_remote_steps") == 5
        assert _value(metrics, "burn_remote_replays") >= 5
        assert _value(metrics, "burn_remote_graphs_compiled") >= 1
        assert _value(metrics, "burn_remote_received_bytes") == 4000
        assert _value(metrics, "burn_remote_sent_bytes") == 5 * 4
        assert _value(metrics, "burn_remote_memory_limit_bytes") == 2**30
        assert _value(metrics, "burn_remote_memory_bytes", pool="tensors", kind="in_use") > 0
        assert _value(metrics, "burn_remote_jobs", state="queued") == 0
        assert _value(metrics, "burn_remote_errors", kind="forbidden") == 1

        # status with the server's own key: sessions, memory, plan cache, jobs
        out = _cli("status", server.target, "--key", str(data / "key"), "--json", home=client_home)
        assert out.returncode == 0, out.stderr
        info = json.loads(out.stdout)
        assert info["peer_id"] == server.peer_id and info["device"] == "cpu"
        mine = [s for s in info["sessions"] if s["peer"] == dev.peer_id or s["tensors"] > 0]
        assert mine and mine[0]["tensors"] >= 1
        assert info["memory"]["limit"] == 2**30
        assert info["plan_cache"]["plans"] >= 1
        assert info["jobs"]["by_state"]["succeeded"] == 0
        flows = {f["flow"]: f for f in info["engine"]["flows"]}  # its first step took a turn
        assert info["engine"]["slots"] >= 1 and flows[str(dev_peer)]["turns"] >= 1
        text = _cli("status", server.target, "--key", str(data / "key"), home=client_home)
        assert (
            text.returncode == 0 and "plan cache:" in text.stdout and "sessions: 2" in text.stdout
        )
        assert f"peer {str(dev_peer)[:12]}...  weight 1" in text.stdout, text.stdout
        refused = _cli("status", server.target, home=client_home)
        assert refused.returncode == 1 and "admins" in refused.stderr
        dev.close()
    finally:
        assert server.stop() == 0
    logs = [json.loads(line) for line in server.output().splitlines() if line.startswith("{")]
    events = [e.get("event") for e in logs]
    assert "session_opened" in events and "session_closed" in events
    assert "server_started" in events
    opened = next(e for e in logs if e.get("event") == "session_opened")
    assert opened["ts"].endswith("Z") and "T" in opened["ts"] and opened["level"] == "info"
    assert opened["session"] >= 1 and len(opened["peer"]) == 52


def test_an_admin_from_the_authorized_peers_file_may_ask_for_status(tmp_path: Path) -> None:
    admin_key, user_key = tmp_path / "admin.key", tmp_path / "user.key"
    admin = Identity.load_or_create(admin_key).peer_id
    user = Identity.load_or_create(user_key).peer_id
    peers = tmp_path / "authorized_peers"
    peers.write_text(f"{admin}  ops  role=admin\n{user}  alice\n")
    server = start_daemon("serve", tmp_path / "s", "--authorized-peers", str(peers))
    try:
        assert f"auth: authorized peers from {peers}" in server.output()
        info = RemoteDevice(server.target, key=admin_key).server_status()
        assert info["jobs"]["by_state"]["running"] == 0
        with pytest.raises(OpFailed, match="admins"):
            RemoteDevice(server.target, key=user_key).server_status()
    finally:
        server.stop()
    text = server.output()
    assert "INFO    server: session 1 opened" in text and "event=session_opened" in text


def test_cli_version_sizes_and_refusals(tmp_path: Path, client_home: Path) -> None:
    out = _cli("--version", home=client_home)
    assert out.returncode == 0 and out.stdout.startswith("burn-remote ")
    bad = _cli("serve", "--allow-any", "--memory-limit", "lots", home=client_home)
    assert bad.returncode == 2 and "not a byte size: 'lots'" in bad.stderr
    missing = _cli("serve", "--authorized-peers", str(tmp_path / "nope"), home=client_home)
    assert missing.returncode == 1
    assert f"--authorized-peers {tmp_path / 'nope'} does not exist" in missing.stderr
    default = _cli("serve", home=client_home)  # no file at the default path either
    assert default.returncode == 1 and "authorized_peers file" in default.stderr
    assert "--allow-any" in default.stderr
    listen = _cli("serve", "--allow-any", "--listen", "::1:4433", home=client_home)
    assert listen.returncode == 1 and "--listen: bad address" in listen.stderr
    assert "in brackets, [::1]:PORT" in listen.stderr


def test_the_relay_has_health_and_metrics_too(tmp_path: Path) -> None:
    relay = start_daemon("relay", tmp_path / "r", "--listen", "127.0.0.1:0", "--http", ":0")
    try:
        http = None
        for _ in range(200):  # the line after "listening on:"
            lines = relay.output().splitlines()
            http = next((ln.split()[1] for ln in lines if ln.startswith("http: ")), None)
            if http:
                break
            time.sleep(0.05)
        assert http, relay.output()
        status, body = _get(http + "/healthz")
        assert status == 200 and json.loads(body)["status"] == "ok"
        status, text = _get(http + "/metrics")
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert families["burn_remote_relay_forwarded"].samples[0].value == 0
        assert families["burn_remote_relay_records"].samples[0].value == 0
        for name in ("limited", "limited_bytes", "observed"):  # nothing limited or asked yet
            assert families[f"burn_remote_relay_{name}"].samples[0].value == 0
    finally:
        assert relay.stop() == 0


def test_healthz_says_503_when_the_loop_stops_and_names_a_storage_error(tmp_path: Path) -> None:
    """In process: a loop that has not ticked for HEALTH_STALL is unhealthy (503); a job
    runner waiting out a full disk is named (body and metrics) but stays 200."""
    from burn_remote.server import _status
    from burn_remote.server._http import OperatorPort
    from burn_remote.server._state import ServerState
    from burn_remote.server.jobs import JobService

    state = ServerState("cpu")
    state.jobs = JobService(tmp_path / "data", state)
    port = OperatorPort(state, ("127.0.0.1", 0))
    url = f"http://127.0.0.1:{port.address[1]}"
    try:
        state.heartbeat = time.monotonic()
        state.jobs.storage_error = "OperationalError: database or disk is full"
        status, body = _get(url + "/healthz")
        info = json.loads(body)
        assert status == 200 and info["jobs"] == "waiting for storage"
        assert "disk is full" in info["jobs_error"]
        metrics = {
            f.name: f.samples[0].value
            for f in text_string_to_metric_families(_get(url + "/metrics")[1])
            if f.samples
        }
        assert metrics["burn_remote_jobs_storage_error"] == 1
        state.heartbeat = time.monotonic() - _status.HEALTH_STALL - 1  # the loop stopped
        status, body = _get(url + "/healthz")
        assert status == 503 and json.loads(body)["status"] == "stalled"
        assert _get(url + "/nope")[0] == 404
    finally:
        port.close()
        state.jobs.close()
