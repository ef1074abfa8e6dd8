"""Identity: key file creation and permissions, peer id text round trip, CLI ``id``."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest
from burn_remote.protocol.transport import (
    PEER_ID_LENGTH,
    Identity,
    KeyFileError,
    PeerId,
)
from burn_remote.protocol.transport._identity import peer_id_of_certificate
from burn_remote.server.cli import main


def test_key_file_created_private_and_reloaded(tmp_path):
    path = tmp_path / "sub" / "key"
    a = Identity.load_or_create(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    b = Identity.load_or_create(path)
    assert a.peer_id == b.peer_id


def test_refuses_group_readable_key(tmp_path):
    path = tmp_path / "key"
    Identity.load_or_create(path)
    os.chmod(path, 0o640)
    with pytest.raises(KeyFileError, match="chmod 600"):
        Identity.load(path)


def test_refuses_non_key_file(tmp_path):
    path = tmp_path / "key"
    path.write_bytes(b"hello")
    os.chmod(path, 0o600)
    with pytest.raises(KeyFileError):
        Identity.load(path)


def test_peer_id_round_trip():
    pid = Identity.generate().peer_id
    text = str(pid)
    assert len(text) == PEER_ID_LENGTH
    assert text == text.lower()
    assert PeerId.parse(text) == pid
    assert PeerId.parse(text.upper() + "====") == pid
    assert PeerId.parse(f"  {text}\n") == pid


@pytest.mark.parametrize("bad", ["", "abc", "1" * PEER_ID_LENGTH, "a" * (PEER_ID_LENGTH + 1)])
def test_peer_id_rejects_garbage(bad):
    with pytest.raises(ValueError):
        PeerId.parse(bad)


def test_certificate_carries_the_key():
    ident = Identity.generate()
    assert peer_id_of_certificate(ident.certificate()) == ident.peer_id


def test_cli_id_prints_peer_id(tmp_path, capsys):
    key = tmp_path / "key"
    assert main(["id", "--key", str(key)]) == 0
    first = capsys.readouterr().out.strip()
    assert main(["id", "--key", str(key)]) == 0
    assert capsys.readouterr().out.strip() == first
    assert PeerId.parse(first) == Identity.load(key).peer_id


def test_cli_id_refuses_open_key(tmp_path, capsys):
    key = tmp_path / "key"
    Identity.load_or_create(key)
    os.chmod(key, 0o644)
    assert main(["id", "--key", str(key)]) == 1
    assert "chmod 600" in capsys.readouterr().err


def test_cli_id_uses_home_env(tmp_path):
    env = dict(os.environ, BURN_REMOTE_HOME=str(tmp_path))
    env.pop("BURN_REMOTE_KEY", None)
    out = subprocess.run(
        [sys.executable, "-m", "burn_remote.server.cli", "id"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert PeerId.parse(out) == Identity.load(tmp_path / "key").peer_id


def test_import_burn_remote_stays_light():
    code = (
        "import sys, burn_remote, burn_remote.protocol; "
        "bad = [m for m in ('trio', 'aioquic', 'cryptography') if m in sys.modules]; "
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
