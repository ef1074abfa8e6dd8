"""docker-compose.yml, the k8s manifests and the systemd unit agree with the CLI.

Docker is not available on CI, so instead of bringing the stack up this parses it: every
``burn-remote`` command line must parse with the real argparse parser (so every flag
exists), and every port a service exposes must be the port its ``--listen`` binds.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import pytest
from burn_remote.server._http import HTTP_TOKEN_ENV
from burn_remote.server.cli import build_parser

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]


def _commands(cmd: list[str] | str) -> list[list[str]]:
    """The burn-remote invocations inside a command (a list, or ``sh -c`` script)."""
    if isinstance(cmd, str):
        cmd = shlex.split(cmd)
    if cmd[:2] == ["sh", "-c"]:
        out: list[list[str]] = []
        script = shlex.split(cmd[2])
        part: list[str] = []
        for tok in [*script, "&&"]:
            if tok in ("&&", ";", "||"):
                if part and part[0] == "exec":
                    part = part[1:]
                if part and part[0] == "burn-remote":
                    out.append(part)
                part = []
            else:
                part.append(tok)
        return out
    return [cmd] if cmd and Path(cmd[0]).name == "burn-remote" else []


def _parse(argv: list[str]) -> argparse.Namespace:
    try:
        return build_parser().parse_args(argv[1:])
    except SystemExit:
        pytest.fail(f"the CLI does not accept: {shlex.join(argv)}")


def _listen_port(ns: argparse.Namespace) -> int:
    return int(ns.listen.rpartition(":")[2])


def test_compose_services_commands_and_ports_agree_with_the_cli() -> None:
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = doc["services"]
    assert {"relay", "s1", "s2", "tests"} <= set(services)
    kinds = {}
    for name, svc in services.items():
        if "gpu" in svc.get("profiles", []):  # tests/deploy/test_gpu_deploy checks it
            continue
        assert svc["build"]["dockerfile"] == "deploy/Dockerfile"
        assert (ROOT / svc["build"]["dockerfile"]).exists()
        cmds = _commands(svc["command"])
        if name == "tests":
            assert "tests/multinode" in svc["command"][-1]
            assert svc["environment"]["BURN_REMOTE_LAB"] == "external"
            relay_host = svc["environment"]["BURN_REMOTE_LAB_RELAY"].split(":")[0]
            assert relay_host in services
            continue
        assert len(cmds) == 1, name
        ns = _parse(cmds[0])
        kinds[name] = ns.command
        published = {int(p.split(":")[-1].split("/")[0]) for p in svc["ports"]}
        assert all(p.endswith("/udp") for p in svc["ports"]), "QUIC is UDP"
        assert published == {_listen_port(ns)}, name
        if ns.command == "serve":
            check = " ".join(svc["healthcheck"]["test"])
            assert ns.http and f"{ns.http}/healthz" in check, name  # probes the server's port
            host, port = ns.relay.split(":")
            assert host in services and kinds.get(host, "relay") == "relay"
            relay_ns = _parse(_commands(services[host]["command"])[0])
            assert int(port) == _listen_port(relay_ns)
    assert kinds == {"relay": "relay", "s1": "serve", "s2": "serve", "s3": "serve"}


def test_k8s_manifests_agree_with_the_cli() -> None:
    docs = []
    for path in sorted((ROOT / "deploy" / "k8s").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    sts = by_kind[("StatefulSet", "burn-remote")]
    relay = by_kind[("Deployment", "burn-remote-relay")]
    relay_svc = by_kind[("Service", "burn-remote-relay")]
    for workload, kind in ((sts, "serve"), (relay, "relay")):
        (container,) = workload["spec"]["template"]["spec"]["containers"]
        (argv,) = _commands(container["command"])
        ns = _parse(argv)
        assert ns.command == kind
        udp = {p["containerPort"] for p in container["ports"] if p["protocol"] == "UDP"}
        assert udp == {_listen_port(ns)}
        (http,) = [p for p in container["ports"] if p["name"] == "http"]
        assert http["containerPort"] == int(ns.http.rpartition(":")[2])
        tcp = {p["containerPort"] for p in container["ports"] if p["protocol"] == "TCP"}
        ring = {ns.ring_port} if kind == "serve" else set()  # the ring's TCP data plane
        assert tcp == {http["containerPort"], *ring}
        for probe in ("livenessProbe", "readinessProbe"):
            get = container[probe]["httpGet"]
            assert get["path"] == "/healthz" and get["port"] == http["name"], probe
        if not ns.http.startswith("127.0.0.1:"):  # reachable beyond the pod: a token guards it
            env = {e["name"]: e for e in container.get("env", [])}
            token = env[HTTP_TOKEN_ENV]["valueFrom"]["secretKeyRef"]
            assert token["name"] and token["key"], kind
        if kind == "serve":
            assert ns.data_dir and ns.log_format == "json"
            assert container["resources"]["requests"]["nvidia.com/gpu"] == 1
            assert ns.device.startswith("cuda")
            secrets = [v for v in workload["spec"]["template"]["spec"]["volumes"] if "secret" in v]
            assert secrets and ns.key.startswith("/data/")
            host, port = ns.relay.split(":")
            assert host == relay_svc["metadata"]["name"]
            assert int(port) == relay_svc["spec"]["ports"][0]["port"]
            assert relay_svc["spec"]["ports"][0]["targetPort"] == 7400
            assert not ns.allow_any  # a fleet admits listed peers only
            svc = by_kind[("Service", "burn-remote")]
            (ring_port,) = [p for p in svc["spec"]["ports"] if p["name"] == "ring"]
            assert ring_port["protocol"] == "TCP" and ring_port["targetPort"] == ns.ring_port


def test_systemd_unit_agrees_with_the_cli() -> None:
    text = (ROOT / "deploy" / "burn-remote.service").read_text()
    (line,) = [ln for ln in text.splitlines() if ln.startswith("ExecStart=")]
    argv = shlex.split(line.removeprefix("ExecStart="))
    ns = _parse(argv)
    assert ns.command == "serve" and ns.data_dir == "/var/lib/burn-remote"
