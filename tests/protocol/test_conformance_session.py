"""Conformance, sections 2, 4 and 10: Hello and Welcome, versions, the first frame, sequence
numbers and acknowledgements, resuming a session. A real server, raw frames (wire.py)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
from burn_remote.protocol.transport import BlockingConnection, Identity
from burn_remote.server.testing import Daemon

from . import spec
from .wire import ERR, MAX_FRAME, VERSION, Raw, frame, msg, unwrap, upload, wrap

pytestmark = pytest.mark.timeout(300)


# --- session ---------------------------------------------------------------------------------
def test_hello_is_answered_by_a_welcome_with_every_documented_field(
    server: Daemon, tmp_path: Path
) -> None:
    client = Raw(server, tmp_path / "key")
    welcome = client.hello()
    assert welcome["version"] == VERSION and welcome["server_peer_id"] == server.peer_id
    assert isinstance(welcome["session_id"], int) and len(welcome["resume_token"]) == 16
    assert set(welcome["limits"]) >= {
        "max_frame", "max_tensors", "max_graphs", "session_memory", "bulk_threshold",
        "bulk_chunk", "resume_grace_ms",
    }  # fmt: skip
    assert welcome["limits"]["max_frame"] == MAX_FRAME
    assert welcome["limits"]["bulk_threshold"] <= MAX_FRAME // 2
    assert welcome["limits"]["bulk_chunk"] <= MAX_FRAME
    assert welcome["limits"]["resume_grace_ms"] == 30_000
    assert isinstance(welcome["extensions"], dict) and welcome["extensions"]
    client.close()


def test_another_version_gets_version_and_the_connection_ends(
    server: Daemon, tmp_path: Path
) -> None:
    client = Raw(server, tmp_path / "key")
    client.send(msg("Hello", 1, b"", {}))
    (err,) = client.replies("Error")
    assert err["code"] == ERR["VERSION"]
    assert "client speaks protocol version 1" in err["message"]
    assert f"this server version {VERSION}" in err["message"]
    assert isinstance(client.closed.get(timeout=30), Exception)


def test_anything_before_hello_is_malformed(server: Daemon, tmp_path: Path) -> None:
    client = Raw(server, tmp_path / "key")
    client.send(msg("Sync", 1))
    (err,) = client.replies("Error")
    assert err["code"] == ERR["MALFORMED"] and "Hello" in err["message"]
    client.close()


# --- resume --------------------------------------------------------------------------------
def test_a_session_resumes_with_a_full_welcome_and_an_unknown_token_expires(
    server: Daemon, tmp_path: Path
) -> None:
    key = tmp_path / "key"
    first = Raw(server, key)
    first.send(raw=wrap(1, 0, frame(msg("Hello", VERSION, b"", {}))))
    _, _, (welcome,) = unwrap(next(first.frames()))
    first.send(raw=wrap(2, 1, frame(upload(1, np.full(2, 7, np.float32)))))
    first.send(raw=wrap(3, 1, frame(msg("Sync", 1))))
    assert unwrap(next(first.frames()))[2][0]["name"] == "Ack"
    first.conn.close("cut", flush_timeout=0)  # no goodbye: the server parks the session

    again = Raw(server, key)
    hello = msg("Hello", VERSION, welcome["resume_token"], {})
    again.send(raw=wrap(0, 2, frame(hello)))
    seq, ack, (resumed,) = unwrap(next(again.frames()))
    assert (seq, ack, resumed["name"]) == (0, 3, "Welcome")
    assert resumed["session_id"] == welcome["session_id"]
    assert resumed["resume_token"] == welcome["resume_token"]  # section 10: the same token
    assert resumed["extensions"] == welcome["extensions"] and resumed["limits"] == welcome["limits"]
    again.send(raw=wrap(4, 2, frame(msg("Read", 2, 1))))
    (data,) = unwrap(next(again.frames()))[2]
    assert np.frombuffer(data["data"], np.float32).tolist() == [7.0, 7.0]
    again.close()

    stranger = Raw(server, tmp_path / "other-key")
    stranger.send(raw=wrap(0, 0, frame(msg("Hello", VERSION, os.urandom(16), {}))))
    (err,) = unwrap(next(stranger.frames()))[2]
    assert err["code"] == ERR["SESSION_EXPIRED"]


@pytest.mark.parametrize(
    "inner",
    [b"\x92\x01", frame(msg("Hello", VERSION, b"", {})), frame(msg("Sync", 1))],
    ids=["undecodable", "hello-without-token", "not-hello"],
)
def test_a_first_frame_with_seq_0_that_is_no_resume_is_answered_malformed(
    server: Daemon, tmp_path: Path, inner: bytes
) -> None:
    """Section 10: seq 0 marks an uncounted frame; a session's first frame is seq 1, or a
    seq 0 Hello with a resume token. Anything else first gets Error(MALFORMED) (section 2),
    in a seq 0 frame, and the connection ends."""
    client = Raw(server, tmp_path / "key")
    client.send(raw=wrap(0, 0, inner))
    seq, _ack, (err,) = unwrap(next(client.frames()))
    assert (seq, err["name"], err["code"], err["request_id"]) == (0, "Error", ERR["MALFORMED"], 0)
    assert "seq 1" in err["message"]
    assert isinstance(client.closed.get(timeout=10), Exception)


# --- gaps of the spec closed (issue 38) ------------------------------------------------------
def test_a_counted_hello_with_a_token_opens_a_new_session(server: Daemon, tmp_path: Path) -> None:
    """Section 10: a token is read only from a seq 0 Hello; in a counted frame (seq 1) it is
    ignored and the Hello opens a new session."""
    client = Raw(server, tmp_path / "key")
    client.send(raw=wrap(1, 0, frame(msg("Hello", VERSION, os.urandom(16), {}))))
    seq, ack, (welcome,) = unwrap(next(client.frames()))
    assert (seq, ack, welcome["name"]) == (1, 1, "Welcome")
    assert len(welcome["resume_token"]) == 16
    client.close()


def test_a_seq_0_frame_with_an_empty_array_only_acknowledges(
    server: Daemon, tmp_path: Path
) -> None:
    """Section 10: a seq 0 frame whose inner frame is an empty array (0x90) carries only its
    ack; the session goes on (an empty inner frame would be the goodbye)."""
    client = Raw(server, tmp_path / "key")
    client.send(raw=wrap(1, 0, frame(msg("Hello", VERSION, b"", {}))))
    next(client.frames())
    client.send(raw=wrap(0, 1, b"\x90"))
    client.send(raw=wrap(2, 1, frame(msg("Sync", 1))))
    seq, ack, (reply,) = unwrap(next(client.frames()))
    assert (seq, ack, reply["name"], reply["request_id"]) == (2, 2, "Ack", 1)
    client.close()


def test_hello_extension_versions_are_strings(server: Daemon, tmp_path: Path) -> None:
    """Section 4: ``extensions`` maps str to str; another type of version is MALFORMED."""
    client = Raw(server, tmp_path / "key")
    client.send(msg("Hello", VERSION, b"", {"demo": 1}))
    (err,) = client.replies("Error")
    assert err["code"] == ERR["MALFORMED"]
    client.close()
    ok = Raw(server, tmp_path / "key2")
    welcome = ok.hello()
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in welcome["extensions"].items())
    ok.close()


def test_a_refused_key_is_told_during_the_handshake_with_the_reason(tmp_path: Path) -> None:
    """Section 1, steps 3 and 4 (issue 38 gap 3, when a refusal arrives): the server decides
    on the client's key proof and refuses then, closing with AUTH_REFUSED and a reason
    naming the check, so the dialler's connect fails; it never gets as far as a control
    stream or a Hello. An admitted key's connect returns."""
    from burn_remote.protocol.transport import PeerRejected
    from burn_remote.server.testing import start_daemon

    section = spec.README.read_text().split("## 1.", 1)[1].split("\n## ")[0]
    reason = re.search(r"`(peer X is not in this server's authorized peers)`", section)
    assert reason and "`0x5A`" in section and "(`AUTH_REFUSED`)" in section
    admitted = Identity.load_or_create(tmp_path / "admitted")
    peers = tmp_path / "authorized_peers"
    peers.write_text(f"{admitted.peer_id}\n")
    server = start_daemon(
        "serve", tmp_path / "server", "--device", "cpu", "--authorized-peers", str(peers)
    )
    try:
        host, port = server.address.rsplit(":", 1)
        stranger = Identity.load_or_create(tmp_path / "stranger")
        expected = reason.group(1).replace("X", str(stranger.peer_id))
        with pytest.raises(PeerRejected, match=re.escape(expected)):
            BlockingConnection.connect(
                stranger,
                server.peer_id,
                (host, int(port)),
                on_frame=lambda *_: None,
                on_closed=lambda _: None,
            )
        ok = BlockingConnection.connect(
            admitted,
            server.peer_id,
            (host, int(port)),
            on_frame=lambda *_: None,
            on_closed=lambda _: None,
        )
        ok.close("done", flush_timeout=1.0)
    finally:
        assert server.stop() == 0, server.output()
