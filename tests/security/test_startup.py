"""No crash from a file or an address: every start-up error is one line naming what is
wrong; an authorized_peers file edited badly while the server runs keeps the last good list;
a wrong ALPN is refused at once with a TLS alert; the data dir is made private."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aioquic.quic.events import ConnectionTerminated
from burn_remote import RemoteDevice, RemoteError
from burn_remote.protocol.transport import EndpointConfig, PeerId
from burn_remote.protocol.transport._auth import SecretSink
from burn_remote.protocol.transport._quic import client_connection
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from .conftest import make_peer

EXE = Path(sys.executable).with_name("burn-remote")


def _serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(EXE), "serve", "--device", "cpu", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "BURN_REMOTE_HOME": str(tmp_path / "home")},
    )


def _one_line_error(out: subprocess.CompletedProcess[str], *words: str) -> None:
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1, out
    assert len(lines) == 1 and lines[0].startswith("burn-remote serve: "), out.stderr
    assert "Traceback" not in out.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_each_start_up_error_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "authorized_peers"
    bad.write_text("# ok\nnot-a-peer-id  alice\n")
    _one_line_error(_serve(tmp_path, "--authorized-peers", str(bad)), f"{bad}:2")
    bad.write_text(f"{PeerId(bytes(32))} role=root\n")
    _one_line_error(_serve(tmp_path, "--authorized-peers", str(bad)), "unknown role 'root'")
    folder = tmp_path / "peers-dir"
    folder.mkdir()
    _one_line_error(_serve(tmp_path, "--authorized-peers", str(folder)), "is a directory")

    key = tmp_path / "enc.key"
    pem = ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )
    fd = os.open(key, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, pem)
    os.close(fd)
    _one_line_error(_serve(tmp_path, "--allow-any", "--key", str(key)), "is encrypted")

    busy = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    busy.bind(("127.0.0.1", 0))
    try:
        port = busy.getsockname()[1]
        out = _serve(tmp_path, "--allow-any", "--listen", f"127.0.0.1:{port}")
        _one_line_error(out, f"cannot listen on 127.0.0.1:{port}", "in use")
    finally:
        busy.close()
    _one_line_error(_serve(tmp_path, "--allow-any", "--listen", "127.0.0.1"), "no port")
    _one_line_error(_serve(tmp_path, "--allow-any", "--listen", "::1"), "brackets")
    _one_line_error(_serve(tmp_path, "--allow-any", "--listen", "h:99999"), "0 to 65535")
    _one_line_error(_serve(tmp_path, "--allow-any", "--peer", "nobody"), "--peer", "PEER@HOST")
    book = tmp_path / "addresses.toml"
    book.write_text("[[peer]]\nid = 'x'\n")
    _one_line_error(_serve(tmp_path, "--allow-any", "--address-book", str(book)), str(book))


def test_bad_edits_of_authorized_peers_keep_the_last_good_list(secure, peers, guard_of, tmp_path):
    server = secure()
    guard = guard_of(server, peers.victim)
    newcomer = make_peer(tmp_path, "newcomer")
    good = peers.file.read_text()

    def admitted(peer) -> bool:  # type: ignore[no-untyped-def]
        dev = RemoteDevice(server.target, key=peer.key)
        try:
            dev.tensor([1.0]).sum().item()
            return True
        except RemoteError:
            return False
        finally:
            dev.close()

    edits = [
        good + f"{newcomer.peer_id[:20]}\n",  # a half-written line
        good + f"{newcomer.peer_id} role=amdin\n",  # a typo
        good.replace(peers.attacker.peer_id, peers.attacker.peer_id + "x"),
        b"\xff\xfe not text".decode("latin-1") + good,
    ]
    for text in edits:
        time.sleep(0.02)
        peers.file.write_text(text)
        assert admitted(peers.attacker), "the last good list still admits the attacker"
        assert not admitted(newcomer)
        assert server.proc.poll() is None
    peers.file.unlink()  # replaced by a directory
    peers.file.mkdir()
    assert admitted(peers.attacker) and not admitted(newcomer)
    peers.file.rmdir()
    peers.file.write_text(good + f"{newcomer.peer_id} newcomer\n")  # a good edit applies
    assert admitted(newcomer)
    assert "not reloaded, the last good list stays" in server.output()
    guard.check()


def test_wrong_alpn_is_refused_at_once_with_a_tls_alert(secure, peers) -> None:
    server = secure("--idle-timeout", "30")
    host, port = server.address.rsplit(":", 1)
    config = EndpointConfig()
    quic = client_connection(peers.victim.identity, config, host, SecretSink())
    quic._configuration.alpn_protocols = ["h3"]
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.settimeout(5.0)  # far under the 30 s idle timeout a silent drop would cost
    try:
        addr = (host, int(port))
        quic.connect(addr, now=time.monotonic())
        for data, _ in quic.datagrams_to_send(time.monotonic()):
            sock.sendto(data, addr)
        data, _ = sock.recvfrom(65536)
        quic.receive_datagram(data, addr, time.monotonic())
        timer = quic.get_timer()  # the draining period after a close: let it pass
        if timer is not None:
            quic.handle_timer(timer)
        events = []
        while (ev := quic.next_event()) is not None:
            events.append(ev)
    finally:
        sock.close()
    closed = [e for e in events if isinstance(e, ConnectionTerminated)]
    assert closed, events
    # CRYPTO_ERROR (0x100) + TLS alert 120 no_application_protocol or 40 handshake_failure
    assert closed[0].error_code in (0x100 + 120, 0x100 + 40), closed[0]
    assert "ALPN" in closed[0].reason_phrase


def test_data_dir_and_everything_in_it_are_made_private(peers, tmp_path: Path) -> None:
    from burn_remote.server.testing import start_daemon

    data = tmp_path / "open-data"
    data.mkdir()
    os.chmod(data, 0o777)
    (data / "artifacts").mkdir()
    os.chmod(data / "artifacts", 0o755)
    (data / "artifacts" / "old").write_bytes(b"x")
    os.chmod(data / "artifacts" / "old", 0o644)
    server = start_daemon("serve", data, "--device", "cpu", "--authorized-peers", str(peers.file))
    try:
        jobs = RemoteDevice(server.target, key=peers.victim.key).jobs
        upload = tmp_path / "u.bin"
        upload.write_bytes(b"u" * 1000)
        jobs.upload(upload)  # files written after the start are private too
    finally:
        assert server.stop() == 0
    seen = 0
    for folder, _dirs, files in os.walk(data):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700, folder
        for f in files:
            mode = stat.S_IMODE(os.stat(Path(folder) / f).st_mode)
            assert mode & 0o077 == 0, (f, oct(mode))
            seen += 1
    assert seen >= 4  # key, jobs.sqlite3, the old file, the uploaded artifact


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create another user's dir")
def test_a_data_dir_of_another_user_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "theirs"
    data.mkdir()
    os.chown(data, 12345, 12345)
    out = _serve(tmp_path, "--allow-any", "--data-dir", str(data))
    _one_line_error(out, "belongs to uid 12345")
