"""`make compose-test`: the docker-compose multi-node suite, on a machine with no registry.

Steps, each skipped when already done (so a second run is fast):

1. Debian packages: docker.io, docker-compose, mmdebstrap and nftables (as root, apt-get).
2. The Docker engine: started (dockerd, detached) when none answers.
3. The base image: a minimal Debian with Python 3.11 from mmdebstrap (base-image.sh).
4. The wheelhouse: ``pip wheel`` of the image's requirements on this host, keyed on them.
5. The image, built FROM the base and installed with ``pip --no-index`` from the wheels.
6. ``docker-compose --profile test up --exit-code-from tests``, while this process makes
   the faults the runner asks for (see tests/multinode/faults.py), then always ``down -v``.

It ends by printing what ran: the services, the tests that passed, the fault cases.
Usage: python deploy/compose/run.py   (from the Makefile: make compose-test)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from requirements import requirements  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "burnremotetest"
"""docker-compose project name: its containers, network and volumes carry this prefix."""
BASE_IMAGE = "burn-remote-base:bookworm"
WHEELS = ROOT / "deploy" / "wheels"
FAULT_DIR = ROOT / ".compose" / "faults"
PACKAGES = {
    "/usr/sbin/dockerd": "docker.io",
    "/usr/bin/docker-compose": "docker-compose",
    "/usr/bin/mmdebstrap": "mmdebstrap",
    "/usr/sbin/nft": "nftables",
}
"""A file each Debian package installs -> the package."""
ENGINE_WAIT = 60.0
"""Seconds a freshly started Docker engine may take to answer."""
UP = ("relay", "s1", "s2", "tests")
"""The services `up` starts and watches; s3 is started by the kill-and-restart case."""
RESTART_WAIT = 90.0
"""Seconds a restarted server may take to listen and publish its record again."""


def say(text: str) -> None:
    print(f"compose-test: {text}", flush=True)


def run(*argv: str, env: dict[str, str] | None = None, quiet: bool = False) -> str:
    """Run a command; its output is returned (and shown with its error when it fails)."""
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(
            f"compose-test: `{' '.join(argv)}` failed ({done.returncode}):\n"
            f"{done.stdout}{done.stderr}"
        )
    if not quiet and done.stdout.strip():
        print(done.stdout.rstrip(), flush=True)
    return done.stdout


# --- 1-2: packages and the engine ----------------------------------------------------------


def ensure_packages() -> None:
    missing = sorted({pkg for path, pkg in PACKAGES.items() if not Path(path).exists()})
    if not missing:
        return
    if os.geteuid() != 0:
        raise SystemExit(f"compose-test: installing {' '.join(missing)} needs root")
    say(f"installing {' '.join(missing)} from Debian's archive")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run("apt-get", "update", "-qq", env=env, quiet=True)
    run("apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing, env=env, quiet=True)


def engine_answers() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


def ensure_engine() -> None:
    if engine_answers():
        return
    say("starting the Docker engine (dockerd; log in /var/log/burn-remote-dockerd.log)")
    with open("/var/log/burn-remote-dockerd.log", "ab") as log:
        # A session of its own and no inherited descriptors: the engine outlives this run
        # and must not hold a lock file (flock) that the caller took.
        subprocess.Popen(
            ["/usr/sbin/dockerd"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )
    deadline = time.monotonic() + ENGINE_WAIT
    while not engine_answers():
        if time.monotonic() > deadline:
            raise SystemExit("compose-test: dockerd did not answer; see its log above")
        time.sleep(0.5)


# --- 3-5: images ---------------------------------------------------------------------------


def ensure_wheelhouse() -> None:
    """``pip wheel`` the image's requirements into deploy/wheels, once per requirement set."""
    if sys.version_info[:2] != (3, 11):
        raise SystemExit(
            "compose-test: the wheelhouse is built with this Python for the image's Python "
            f"3.11; run with python3.11 (this is {sys.version.split()[0]})"
        )
    reqs = requirements(ROOT / "pyproject.toml")
    key = hashlib.sha256("\n".join(reqs).encode()).hexdigest()
    stamp = WHEELS / ".key"
    if stamp.exists() and stamp.read_text() == key and any(WHEELS.glob("*.whl")):
        say(f"wheelhouse: {len(list(WHEELS.glob('*.whl')))} wheels (cached)")
        return
    for old in WHEELS.glob("*.whl"):
        old.unlink()
    say("wheelhouse: pip wheel " + " ".join(reqs))
    run(sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(WHEELS), *reqs)
    stamp.write_text(key)
    say(f"wheelhouse: {len(list(WHEELS.glob('*.whl')))} wheels built")


def compose_env() -> dict[str, str]:
    return {
        **os.environ,
        "BURN_REMOTE_BASE": BASE_IMAGE,
        "BURN_REMOTE_PIP_OPTIONS": "--no-index --find-links /wheels",
        "BURN_REMOTE_FAULT_DIR": str(FAULT_DIR),
    }


def compose(*args: str) -> list[str]:
    """A docker-compose command line for this project, with the runner's profiles on."""
    return [
        "docker-compose",
        *("-p", PROJECT, "-f", str(ROOT / "docker-compose.yml")),
        *("--profile", "test", "--profile", "faults", *args),
    ]


def build_images() -> None:
    run(str(ROOT / "deploy" / "compose" / "base-image.sh"), BASE_IMAGE)
    ensure_wheelhouse()
    started = time.monotonic()
    # Every CPU service shares the image burn-remote:cpu: building it once builds it for all.
    run(*compose("build", "-q", "tests"), env=compose_env(), quiet=True)
    say(f"image burn-remote:cpu built from {BASE_IMAGE} ({time.monotonic() - started:.0f} s)")
    # The image a rebuild replaced keeps its layers as an untagged image: drop those.
    run("docker", "image", "prune", "-f", "--filter", "label=org.burn-remote.image", quiet=True)


# --- 6: faults made from the host ----------------------------------------------------------


def container(service: str) -> str:
    cid = run(*compose("ps", "-q", service), quiet=True).strip()
    if not cid:
        raise RuntimeError(f"no container for service {service}")
    return cid


def inspect(cid: str, template: str) -> str:
    return run("docker", "inspect", "-f", template, cid, quiet=True).strip()


def nft_in(cid: str, script: str) -> str:
    """Run an nft script in the container's network namespace, from the host."""
    pid = inspect(cid, "{{.State.Pid}}")
    done = subprocess.run(
        ["nsenter", "-t", pid, "-n", "nft", "-f", "-"], input=script, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"nft in {cid[:12]}: {done.stderr.strip()}")
    return done.stdout


LOSS_TABLE = "burn_remote_loss"


def loss_rules(percent: int) -> str:
    """Drop ``percent`` % of UDP datagrams each way, at random (nftables ``numgen``: this
    kernel has no netem); the counters say how many were dropped and passed."""
    chains = []
    for chain, hook in (("inbound", "input"), ("outbound", "output")):
        chains.append(
            f"  chain {chain} {{ type filter hook {hook} priority -10;\n"
            f"    meta l4proto udp numgen random mod 100 < {percent} counter drop\n"
            f"    meta l4proto udp counter\n  }}"
        )
    return f"table inet {LOSS_TABLE} {{\n" + "\n".join(chains) + "\n}\n"


def _answer(path: Path, report: dict[str, Any]) -> None:
    """Write a fault's answer whole under a private name, then rename it in place: the test
    side polls for the file and must never read it empty or half written (it once read an
    empty .done while the host was still writing it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report))
    tmp.replace(path)


class FaultInjector:
    """Answers the runner's fault requests (files in FAULT_DIR) until stopped."""

    def __init__(self) -> None:
        self.done: list[str] = []
        self.started: list[str] = []
        """Services started for a fault case (beside those `up` started)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        shutil.rmtree(FAULT_DIR, ignore_errors=True)
        FAULT_DIR.mkdir(parents=True)
        FAULT_DIR.chmod(0o777)  # the runner writes here
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _loop(self) -> None:
        seen: set[str] = set()
        while not self._stop.is_set():
            for req in sorted(FAULT_DIR.glob("*.json")):
                if req.name in seen:
                    continue
                seen.add(req.name)
                threading.Thread(target=self._serve, args=(req,), daemon=True).start()
            time.sleep(0.1)

    def _serve(self, req: Path) -> None:
        base = req.with_suffix("")
        try:
            spec = json.loads(req.read_text())
            action = getattr(self, "_" + spec.pop("action"))
            report = action(base, **spec)
        except Exception as exc:  # the runner raises it
            report = {"error": f"{type(exc).__name__}: {exc}"}
            _answer(base.with_suffix(".started"), report)
        _answer(base.with_suffix(".done"), report)
        self.done.append(f"{req.stem}: {json.dumps(report)}")
        say(f"fault {req.stem}: {json.dumps(report)}")

    @staticmethod
    def _started(base: Path) -> None:
        _answer(base.with_suffix(".started"), {})

    def _pause(self, base: Path, service: str, seconds: float) -> dict[str, Any]:
        cid = container(service)
        run("docker", "pause", cid, quiet=True)
        began = time.monotonic()
        self._started(base)
        time.sleep(seconds)
        run("docker", "unpause", cid, quiet=True)
        return {"paused_s": round(time.monotonic() - began, 1)}

    def _disconnect(self, base: Path, service: str, seconds: float) -> dict[str, Any]:
        cid = container(service)
        network = f"{PROJECT}_lab"
        ip = inspect(cid, '{{(index .NetworkSettings.Networks "' + network + '").IPAddress}}')
        run("docker", "network", "disconnect", network, cid, quiet=True)
        began = time.monotonic()
        self._started(base)
        time.sleep(seconds)
        run("docker", "network", "connect", "--ip", ip, "--alias", service, network, cid)
        return {
            "disconnected_s": round(time.monotonic() - began, 1),
            "address": ip,
            "running": inspect(cid, "{{.State.Running}}") == "true",
        }

    def _loss(self, base: Path, service: str, percent: int) -> dict[str, Any]:
        nft_in(container(service), loss_rules(int(percent)))
        self._started(base)
        return {"percent": int(percent)}

    def _heal(self, base: Path, service: str) -> dict[str, Any]:
        cid = container(service)
        listing = nft_in(cid, f"list table inet {LOSS_TABLE}\n")
        nft_in(cid, f"delete table inet {LOSS_TABLE}\n")
        self._started(base)
        counts = [int(n) for n in re.findall(r"counter packets (\d+)", listing)]
        dropped, passed = counts[0] + counts[2], counts[1] + counts[3]
        return {"dropped": dropped, "passed": passed}

    def _start(self, base: Path, service: str) -> dict[str, Any]:
        """Start a service `up` does not watch; report its peer id once it is published."""
        since = str(int(time.time()))
        run(*compose("up", "-d", "--no-deps", "--no-build", service), env=compose_env())
        cid = container(service)
        self.started.append(service)
        logs = _wait_published(cid, since, service)
        self._started(base)
        return {"peer_id": re.search(r"peer id: (\S+)", logs).group(1)}  # type: ignore[union-attr]

    def _kill_restart(self, base: Path, service: str) -> dict[str, Any]:
        cid = container(service)
        run("docker", "kill", cid, quiet=True)  # SIGKILL: no shutdown path runs
        self._started(base)
        since = str(int(time.time()))
        run("docker", "start", cid, quiet=True)
        _wait_published(cid, since, service)
        return {"restarted": True, "volume": f"{PROJECT}_{service}-data"}


def _wait_published(cid: str, since: str, service: str) -> str:
    """The container's log since ``since``, once the server says its record is published."""
    deadline = time.monotonic() + RESTART_WAIT
    while "record published" not in (logs := _logs(cid, since)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{service} did not start:\n{logs}")
        time.sleep(0.2)
    return logs


def _logs(cid: str, since: str) -> str:
    done = subprocess.run(["docker", "logs", "--since", since, cid], capture_output=True, text=True)
    return done.stdout + done.stderr


# --- the run -------------------------------------------------------------------------------


def up() -> tuple[int, list[str]]:
    """``up --exit-code-from tests``, echoed as it runs; returns its status and lines."""
    lines: list[str] = []
    argv = compose("up", "--no-build", "--no-color", "--exit-code-from", "tests", *UP)
    proc = subprocess.Popen(
        argv, env=compose_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        print(line, end="", flush=True)
    return proc.wait(), lines


def summary(status: int, lines: list[str], injector: FaultInjector, took: float) -> None:
    services = [*UP, *injector.started]
    runner = [ln.split("|", 1)[1].strip() for ln in lines if ln.startswith("tests_1")]
    passed = [ln.split()[0] for ln in runner if ln.endswith("PASSED") or " PASSED " in ln]
    totals = [ln for ln in runner if re.search(r"\d+ (passed|failed)", ln) and "=" in ln]
    print("\n==== compose-test: what ran ====", flush=True)
    print(f"services: {', '.join(services)}")
    print(f"tests passed ({len(passed)}):")
    for name in passed:
        print(f"  {name}")
    for total in totals:
        print(f"pytest: {total.strip('= ')}")
    print(f"fault cases ({len(injector.done)}):")
    for case in injector.done:
        print(f"  {case}")
    verdict = "passed" if status == 0 else f"FAILED (tests exited {status})"
    print(f"compose-test {verdict} in {took:.0f} s", flush=True)


def main() -> int:
    began = time.monotonic()
    ensure_packages()
    ensure_engine()
    build_images()
    injector = FaultInjector()
    injector.start()
    try:
        status, lines = up()
    finally:
        injector.stop()
        subprocess.run(compose("down", "-v"), env=compose_env())
    summary(status, lines, injector, time.monotonic() - began)
    return status


if __name__ == "__main__":
    sys.exit(main())
