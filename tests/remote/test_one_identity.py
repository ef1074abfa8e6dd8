"""One identity per node: `burn-remote id` with serve's flags prints the id `serve` presents,
`serve` says where its key lives, and a server always admits its own key as an admin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from burn_remote.protocol.transport import Identity
from burn_remote.server.cli import DEFAULT_SERVE_LISTEN, build_parser
from burn_remote.server.testing import start_daemon

EXE = Path(sys.executable).with_name("burn-remote")


def _cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BURN_REMOTE_")}
    return subprocess.run(
        [str(EXE), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "BURN_REMOTE_HOME": str(home)},
    )


def test_id_with_serves_flags_prints_the_id_serve_presents(tmp_path: Path) -> None:
    home, data = tmp_path / "home", tmp_path / "srvdata"
    node = _cli("id", home=home)
    served = _cli("id", "--data-dir", str(data), home=home)
    assert node.returncode == served.returncode == 0, (node, served)
    assert served.stderr.strip() == f"key file: {data / 'key'}"
    assert served.stdout.strip() != node.stdout.strip()  # the node key is not the server's
    server = start_daemon(
        "serve", data, "--allow-any", env={**os.environ, "BURN_REMOTE_HOME": str(home)}
    )
    try:
        assert server.peer_id == served.stdout.strip()
        assert f"key file: {data / 'key'}" in server.output()
    finally:
        server.stop()


def test_a_server_admits_its_own_key_as_admin(tmp_path: Path) -> None:
    """The peers file names someone else only; `status --key DATA_DIR/key` still works."""
    data, home = tmp_path / "srv", tmp_path / "home"
    other = Identity.generate().peer_id
    peers = tmp_path / "authorized_peers"
    peers.write_text(f"{other}\n")
    server = start_daemon("serve", data, "--authorized-peers", str(peers))
    try:
        out = _cli("status", server.target, "--key", str(data / "key"), home=home)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith(f"server {server.peer_id} on cpu"), out.stdout
        stranger = _cli("status", server.target, home=home)  # a key not in the file
        assert stranger.returncode == 1 and "not in this server's authorized peers" in (
            stranger.stderr
        )
    finally:
        server.stop()


def test_serve_listens_on_a_fixed_documented_port_by_default() -> None:
    """Port 0 would change the address at every restart (the address book goes stale);
    binding it for real is tests/multinode/test_readme.py, in a namespace of its own."""
    args = build_parser().parse_args(["serve"])
    assert args.listen == DEFAULT_SERVE_LISTEN == "127.0.0.1:7000"
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "127.0.0.1:7000" in readme
