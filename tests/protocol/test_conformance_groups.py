"""Conformance, sections 4.1, 6 and 12: device groups, their links and data plane. A real
server, raw frames (wire.py)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest
from burn_remote.protocol.transport import Identity
from burn_remote.server.testing import Daemon

from .wire import ERR, F32, MSG, VERSION, Raw, errors, graph, msg, upload

pytestmark = pytest.mark.timeout(300)


# --- device groups (section 11) ------------------------------------------------------------------
GROUP_PREFIX = r"group (?P<group>[0-9a-f]{16}): rank (?P<rank>-?\d+) \((?P<peer>[^)]*)\): "
"""The start of an Error(GROUP) message, as section 6 writes it."""


def test_a_one_rank_group_all_reduces_inside_a_graph(raw: Raw, server: Daemon) -> None:
    import re

    gid = 0x1234
    raw.send(msg("GroupSetup", 1, gid, 0, [server.peer_id], os.urandom(32), 5000))
    (ready,) = raw.replies("GroupReady")
    assert (ready["request_id"], ready["device"]) == (1, "cpu")
    raw.send(msg("GroupStart", 2, gid, "ring"))
    (ack,) = raw.replies("Ack")
    assert ack["request_id"] == 2
    nodes = [["all_reduce", [0], [["group", gid], ["op", "mean"]], [[[3], F32]]]]
    data, digest = graph([[[3], F32]], nodes, [1])
    x = np.array([1.0, -2.0, 3.5], np.float32)
    raw.send(
        upload(1, x),
        msg("RegisterGraph", 3, digest, data),
        msg("ExecuteGraph", 4, digest, [1], [], [2], []),
        msg("Read", 5, 2),
    )
    (data_reply,) = raw.replies("Data")
    assert np.frombuffer(data_reply["data"], np.float32).tolist() == x.tolist()
    raw.send(msg("GroupClose", gid), msg("ExecuteGraph", 6, digest, [1], [], [3], []))
    raw.send(msg("Sync", 7))
    (err,) = errors(raw.replies("Ack"))
    assert (err["code"], err["node"], err["request_id"]) == (ERR["GROUP"], 0, 6)
    found = re.match(GROUP_PREFIX, err["message"])
    assert found and found["group"] == f"{gid:016x}" and found["rank"] == "-1", err


def test_group_setup_refusals_are_group(raw: Raw, server: Daemon) -> None:
    other = str(Identity.generate().peer_id)
    raw.send(
        msg("GroupSetup", 1, 5, 0, [other, server.peer_id], os.urandom(32), 1000),  # not it
        msg("GroupSetup", 2, 6, 0, [server.peer_id, server.peer_id], os.urandom(32), 1000),
        msg("GroupSetup", 3, 7, 0, [server.peer_id], os.urandom(31), 1000),  # short capability
        msg("GroupStart", 4, 99, "ring"),  # never set up
        msg("Sync", 5),
    )
    errs = errors(raw.replies("Ack"))
    assert [(e["code"], e["request_id"]) for e in errs] == [(ERR["GROUP"], r) for r in (1, 2, 3, 4)]
    assert "not this server" in errs[0]["message"] and "twice" in errs[1]["message"]


def _ring_hello(
    host: str, port: int, gid: int, rank: int, key: bytes, mode: bytes = b"\x00", offer: bytes = b""
) -> bytes | None:
    """§12's TCP data-plane hello, written from the spec (and a mode-2 ``offer`` after it):
    what the successor's sealed answer opens to, or None if it closed the connection."""
    import socket

    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    aead, aad = AESGCM(key), gid.to_bytes(8, "big")
    hello = aead.encrypt(bytes(4) + bytes(8), b"ring data link" + mode, aad)
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(b"burnring" + struct.pack(">QQ", gid, rank) + hello + offer)
        answer = b""
        while len(answer) < len(hello):
            try:
                more = sock.recv(len(hello) - len(answer))
            except ConnectionResetError:  # closed with our bytes unread
                return None
            if not more:
                return None
            answer += more
    return aead.decrypt((1).to_bytes(4, "big") + bytes(8), answer, aad)


def _group_with_a_neighbour(
    raw: Raw, server: Daemon, tmp_path: Path, gid: int
) -> tuple[Path, str, bytes]:
    """GroupSetup of the server as rank 0 and a neighbour (rank 1) the test plays: the
    neighbour's key file, its peer id and the group's capability."""
    neighbour_key = tmp_path / "neighbour"
    neighbour = str(Identity.load_or_create(neighbour_key).peer_id)
    cap = os.urandom(32)
    raw.send(msg("GroupSetup", 1, gid, 0, [server.peer_id, neighbour], cap, 5000))
    raw.replies("GroupReady")
    return neighbour_key, neighbour, cap


def test_a_group_link_needs_the_capability_and_the_right_rank(
    raw: Raw, server: Daemon, tmp_path: Path
) -> None:
    gid = 0x77
    neighbour_key, neighbour, cap = _group_with_a_neighbour(raw, server, tmp_path, gid)
    wrong = Raw(server, neighbour_key)
    wrong.send(msg("GroupLink", VERSION, gid, 1, os.urandom(32), "", b""))
    (err,) = wrong.replies("Error")
    assert err["code"] == ERR["CAPABILITY"] and "capability" in err["message"]
    right = Raw(server, neighbour_key)
    right.send(msg("GroupLink", VERSION, gid, 1, cap, "", b""))
    (answer,) = right.replies("GroupLink")
    assert (answer["group_id"], answer["rank"], answer["capability"]) == (gid, 0, b"")
    assert answer["ring_address"].startswith(":") and len(answer["ring_key"]) == 32
    port = int(answer["ring_address"][1:])
    host = server.address.rsplit(":", 1)[0]
    key = answer["ring_key"]
    assert _ring_hello(host, port, gid, 1, os.urandom(32)) is None  # another key: closed
    assert _ring_hello(host, port, gid, 1, key) == b"ring data link\x00"  # sealed records
    # the link is up (one per group link): a second hello is refused, plain or not
    assert _ring_hello(host, port, gid, 1, key, b"\x01") is None
    right.send(msg("GroupBeat", gid, 0, 0))
    # the server must dial its successor (rank 1) itself: it knows no address for it
    raw.send(msg("GroupStart", 2, gid, "ring"))
    (err,) = errors(raw.replies("Error", timeout=60))
    assert err["code"] == ERR["GROUP"] and f"rank 1 ({neighbour})" in err["message"]
    right.close()


def _shared_segment(nonce: bytes) -> int:
    """§12 mode 2's segment, from the spec: a memfd of 4096 + 16 MiB bytes, the nonce
    first, sealed against resizing."""
    import fcntl

    fd = os.memfd_create("conformance", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, 4096 + 16 * 2**20)
    os.pwrite(fd, nonce, 0)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    return fd


@pytest.mark.parametrize("nonce_right", [True, False], ids=["segment", "wrong-nonce"])
def test_a_same_host_dialler_may_offer_shared_memory(
    raw: Raw, server: Daemon, tmp_path: Path, nonce_right: bool
) -> None:
    """§12 mode 2: a loopback dialler offering its sealed memfd (pid, fd, nonce after the
    hello) is answered 2; an offer whose segment does not hold that nonce is answered 1
    (plain TCP), not refused."""
    gid = 0x79 if nonce_right else 0x7A
    neighbour_key, _, cap = _group_with_a_neighbour(raw, server, tmp_path, gid)
    right = Raw(server, neighbour_key)
    right.send(msg("GroupLink", VERSION, gid, 1, cap, "", b""))
    (answer,) = right.replies("GroupLink")
    port = int(answer["ring_address"][1:])
    host = server.address.rsplit(":", 1)[0]
    nonce = os.urandom(16)
    fd = _shared_segment(nonce)
    try:
        offer = struct.pack(">II", os.getpid(), fd) + (nonce if nonce_right else os.urandom(16))
        opened = _ring_hello(host, port, gid, 1, answer["ring_key"], b"\x02", offer)
    finally:
        os.close(fd)
    assert opened == b"ring data link" + (b"\x02" if nonce_right else b"\x01")
    right.close()


def test_a_group_link_of_another_version_is_version_and_fails_the_group_naming_both(
    raw: Raw, server: Daemon, tmp_path: Path
) -> None:
    """§4.1: version 2's GroupLink (no version field) and a later version's (its version
    first) are both answered VERSION naming the two versions; the group fails at once."""
    gid = 0x78
    neighbour_key, neighbour, cap = _group_with_a_neighbour(raw, server, tmp_path, gid)
    later = Raw(server, neighbour_key)
    later.send([MSG["GroupLink"].tag, VERSION + 1, gid, 1, cap, "", b"", "a field of v4"])
    (err,) = later.replies("Error")
    assert err["code"] == ERR["VERSION"]
    assert (
        f"successor speaks protocol version {VERSION}, the dialler {VERSION + 1}"
        in (err["message"])
    )
    old = Raw(server, neighbour_key)
    old.send([MSG["GroupLink"].tag, gid, 1, cap, "", b""])  # version 2's five fields
    (err,) = old.replies("Error")
    assert err["code"] == ERR["VERSION"] and "the dialler 2" in err["message"]
    raw.send(msg("GroupStart", 2, gid, "ring"))
    (err,) = errors(raw.replies("Error", timeout=60))
    assert err["code"] == ERR["GROUP"] and f"rank 1 ({neighbour})" in err["message"]
    assert f"protocol version {VERSION + 1}, this server version {VERSION}" in err["message"]
