"""The README's first hour, run as written: the quick start in a fresh virtual environment
with no extras, and the two-machine walkthrough on two network namespaces (two homes, the
address book by name, status with the server's own key).

Each namespace has its own loopback and ports, so the README's fixed port 7000 is used as
printed without meeting another test's server.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.fresh_venv import fresh_venv
from support.readme_steps import Command, blocks, commands

from .conftest import _ip, netns_refusal

ROOT = Path(__file__).resolve().parents[2]
BANNER = re.compile(r"connect with: RemoteDevice\('([^']+)'\)")
pytestmark = pytest.mark.netns


@pytest.fixture
def namespaces() -> Iterator[dict[str, str]]:
    """``gpu-box`` (10.0.0.5) and ``laptop`` (10.0.0.6) joined by one veth pair."""
    reason = netns_refusal()
    if reason is not None:
        pytest.skip(reason)
    tag = secrets.token_hex(3)
    names = {"gpu-box": f"brr{tag}-srv", "laptop": f"brr{tag}-cli"}
    try:
        for ns in names.values():
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", names["gpu-box"], "link", "add", "eth0", "type", "veth", "peer", "name",
            "eth0", "netns", names["laptop"])  # fmt: skip
        for host, ns in names.items():
            _ip("-n", ns, "addr", "add", "10.0.0.5/24" if host == "gpu-box" else "10.0.0.6/24",
                "dev", "eth0")  # fmt: skip
            _ip("-n", ns, "link", "set", "eth0", "up")
        yield names
    finally:
        for ns in names.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


class Host:
    """One machine of the README: a network namespace, a home, a PATH with `bin` first."""

    def __init__(self, ns: str, home: Path, bin_dir: Path, subst: dict[str, str]) -> None:
        self.ns, self.home, self.bin_dir, self.subst = ns, home, bin_dir, subst
        home.mkdir(parents=True, mode=0o700, exist_ok=True)
        self.daemons: list[tuple[subprocess.Popen, list[str]]] = []

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("BURN_REMOTE_")}
        env.update(HOME=str(self.home), PATH=f"{self.bin_dir}:{os.environ['PATH']}")
        env.pop("VIRTUAL_ENV", None)
        env.pop("XDG_CONFIG_HOME", None)
        return env

    def expand(self, text: str) -> str:
        for placeholder, value in self.subst.items():
            text = text.replace(placeholder, value)
        return text

    def argv(self, line: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns, "bash", "-c", self.expand(line)]

    def run(self, line: str, timeout: float = 120) -> str:
        out = subprocess.run(
            self.argv(line), capture_output=True, text=True, env=self.env(), timeout=timeout
        )
        assert out.returncode == 0, f"`{line}` failed ({out.returncode}):\n{out.stdout}{out.stderr}"
        return out.stdout

    def start(self, line: str, timeout: float = 60) -> str:
        """Start a daemon the README runs in the foreground; returns its banner's target."""
        proc = subprocess.Popen(
            self.argv(line),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env(),
            start_new_session=True,
        )
        lines: list[str] = []
        found = threading.Event()

        def drain() -> None:
            for text in proc.stdout:  # type: ignore[union-attr]
                lines.append(text)
                if BANNER.search(text):
                    found.set()

        threading.Thread(target=drain, daemon=True).start()
        self.daemons.append((proc, lines))
        if not found.wait(timeout):
            raise AssertionError(f"`{line}` did not start:\n{''.join(lines)}")
        return next(m.group(1) for t in lines if (m := BANNER.search(t)))

    def stop(self) -> str:
        """SIGTERM every daemon started here; their output."""
        text = ""
        for proc, lines in self.daemons:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)
            text += "".join(lines)
        self.daemons.clear()
        return text


def run_commands(steps: list[Command], hosts: dict[str, Host], subst: dict[str, str]) -> None:
    for step in steps:
        host = hosts[step.host]
        if step.line.startswith("burn-remote serve"):
            host.start(step.line)
        else:
            out = host.run(step.line)
            if step.prints:
                subst[step.prints] = out.strip().splitlines()[-1]


@pytest.mark.slow
def test_quick_start_in_a_fresh_venv_without_extras(namespaces, tmp_path: Path) -> None:
    """`pip install .` alone runs the README's `serve` on its default port and the client
    script; a restart keeps the address the client dialled."""
    bin_dir = fresh_venv(tmp_path)
    for heavy in ("torch", "onnx", "onnxruntime", "cupy", "sklearn", "pytest"):
        probe = subprocess.run(
            [str(bin_dir / "python"), "-c", f"import {heavy}"], capture_output=True
        )
        assert probe.returncode != 0, f"{heavy} is installed without any extra"
    subst: dict[str, str] = {}
    host = Host(namespaces["laptop"], tmp_path / "home", bin_dir, subst)
    shell, script = [b for lang, b in blocks("Quick start")[1:3]]
    try:
        steps = commands(shell)
        run_commands(steps[:-1], {"local": host}, subst)
        target = host.start(steps[-1].line)
        peer, address = target.split("@")
        assert address == "127.0.0.1:7000", "the default listening address is documented"
        subst["PEER"] = peer
        (tmp_path / "client.py").write_text(host.expand(script))
        out = host.run(f"python {tmp_path / 'client.py'}")
        loss = float(re.search(r"loss after 200 steps: (\S+)", out).group(1))
        assert loss < 0.1, out  # y = sum(x) is learnt
        host.stop()
        assert host.start(steps[-1].line) == target  # same key, same port after a restart
        assert "loss after 200 steps" in host.run(f"python {tmp_path / 'client.py'}")
    finally:
        host.stop()


def test_two_machine_walkthrough(namespaces, tmp_path: Path) -> None:
    """Every command of "Two machines", each on its machine, with the address book by name
    and `status` as admin with the server's own key."""
    bin_dir = Path(sys.executable).parent
    srv = tmp_path / "gpu-box"
    subst = {"/srv/br": str(srv / "srv" / "br")}
    hosts = {
        "gpu-box": Host(namespaces["gpu-box"], srv / "home", bin_dir, subst),
        "laptop": Host(namespaces["laptop"], tmp_path / "laptop" / "home", bin_dir, subst),
    }
    (srv / "srv").mkdir(parents=True)
    found = blocks("Two machines")
    assert [lang for lang, _ in found] == ["", "toml", ""]
    try:
        run_commands(commands(found[0][1]), hosts, subst)
        assert re.fullmatch(r"[a-z2-7]{52}", subst["SERVER_ID"]), subst
        assert subst["SERVER_ID"] != subst["CLIENT_ID"], "two homes, two keys"
        book = hosts["laptop"].home / ".config" / "burn-remote" / "addresses.toml"
        book.write_text(hosts["laptop"].expand(found[1][1]))
        steps = commands(found[2][1])
        assert [s.host for s in steps] == ["laptop", "laptop", "gpu-box"]
        assert hosts["laptop"].run(steps[0].line) == "no jobs\n"  # by name, via the book
        assert hosts["laptop"].run(steps[1].line).strip() == "3.0"
        status = hosts["gpu-box"].run(steps[2].line)
        assert status.startswith(f"server {subst['SERVER_ID']} on cpu"), status
    finally:
        for h in hosts.values():
            h.stop()
