"""Conformance, sections 4 and 8: capabilities (Expose, Fetch), jobs, artifacts and server
status. A real server, raw frames (wire.py)."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest
from burn_remote.protocol.transport import Identity
from burn_remote.server.testing import Daemon

from .wire import ERR, Raw, msg, upload

pytestmark = pytest.mark.timeout(300)


# --- capabilities --------------------------------------------------------------------------
def test_expose_gives_a_token_and_refuses_what_is_not_a_peer_id(raw: Raw) -> None:
    raw.send(upload(1, np.ones(2, np.float32)), msg("Expose", 1, 1, "a" * 52))
    (token,) = raw.replies("Token")
    assert token["request_id"] == 1 and len(token["token"]) == 32
    raw.send(msg("Expose", 2, 1, "some-server"))
    (err,) = raw.replies("Error")
    assert (err["code"], err["request_id"]) == (ERR["MALFORMED"], 2)


def test_a_fetch_with_a_token_nobody_granted_is_capability(raw: Raw, server: Daemon) -> None:
    server.know(server)  # the source (here itself) must be in the server's own address book
    raw.send(msg("Fetch", 9, server.peer_id, "", os.urandom(32)), msg("Sync", 1))
    err, _ = raw.replies("Ack", timeout=60)
    assert err["code"] == ERR["CAPABILITY"]
    raw.send(msg("Read", 2, 9))
    (missing,) = raw.replies("Error")
    assert missing["code"] == ERR["MISSING_TENSOR"]  # nothing was stored


def test_a_fetch_naming_an_address_is_forbidden(raw: Raw, server: Daemon) -> None:
    raw.send(msg("Fetch", 9, server.peer_id, server.address, os.urandom(32)), msg("Sync", 1))
    err, _ = raw.replies("Ack")
    assert err["code"] == ERR["FORBIDDEN"] and "source_address" in err["message"]


def test_a_fetch_from_a_peer_the_server_cannot_resolve_is_capability(raw: Raw) -> None:
    stranger = str(Identity.generate().peer_id)
    raw.send(msg("Fetch", 9, stranger, "", os.urandom(32)), msg("Sync", 1))
    err, _ = raw.replies("Ack", timeout=60)
    assert err["code"] == ERR["CAPABILITY"] and "knows no address" in err["message"]


# --- jobs and artifacts --------------------------------------------------------------------
def test_job_messages_and_artifacts(raw: Raw) -> None:
    blob = os.urandom(100_000)
    digest = hashlib.sha256(blob).digest()
    raw.send(
        msg("ArtifactPut", 1, digest, 0, len(blob), blob[:60_000]),
        msg("ArtifactPut", 2, digest, 60_000, len(blob), blob[60_000:]),
        msg("ArtifactGet", 3, digest, 0, 2**20),
    )
    replies = raw.replies("ArtifactChunk")
    assert [r["name"] for r in replies] == ["Ack", "Ack", "ArtifactChunk"]
    assert replies[2]["data"] == blob and replies[2]["total"] == len(blob)
    bad = hashlib.sha256(b"other").digest()
    raw.send(msg("ArtifactPut", 4, bad, 0, 5, b"hello"))
    (err,) = raw.replies("Error")
    assert (err["code"], err["request_id"]) == (ERR["JOB"], 4)
    raw.send(msg("JobSubmit", 5, b'{"kind": "lora", "lora": {"r": "8x"}}'))
    (err,) = raw.replies("Error")
    assert err["code"] == ERR["JOB"] and err["request_id"] == 5
    raw.send(msg("JobList", 6, 0, 10))
    (info,) = raw.replies("JobInfo")
    assert info["request_id"] == 6 and isinstance(info["info"], bytes)
    for name in ("JobStatus", "JobCancel"):
        raw.send(msg(name, 7, 424242))
        (err,) = raw.replies("Error")
        assert (err["code"], err["request_id"]) == (ERR["JOB"], 7)
    raw.send(msg("JobWatch", 8, 424242, 0))
    (err,) = raw.replies("Error")
    assert (err["code"], err["request_id"]) == (ERR["JOB"], 8)


def test_server_status_is_forbidden_to_other_peers(raw: Raw) -> None:
    raw.send(msg("ServerStatus", 1))
    (err,) = raw.replies("Error")
    assert (err["code"], err["request_id"]) == (ERR["FORBIDDEN"], 1)


def test_artifact_get_sends_at_most_one_artifact_chunk(raw: Raw) -> None:
    """Section 8: an ArtifactGet answers at most ARTIFACT_CHUNK (1 MiB) bytes whatever
    ``length`` asks; the client asks again from where the chunk ended."""
    chunk = 2**20
    blob = os.urandom(chunk + chunk // 2)
    digest = hashlib.sha256(blob).digest()
    raw.send(
        msg("ArtifactPut", 1, digest, 0, len(blob), blob[:chunk]),
        msg("ArtifactPut", 2, digest, chunk, len(blob), blob[chunk:]),
        msg("ArtifactGet", 3, digest, 0, len(blob)),
    )
    first = raw.replies("ArtifactChunk")[-1]
    assert (len(first["data"]), first["offset"], first["total"]) == (chunk, 0, len(blob))
    raw.send(msg("ArtifactGet", 4, digest, chunk, len(blob)))
    (rest,) = raw.replies("ArtifactChunk")
    assert first["data"] + rest["data"] == blob
    raw.send(msg("ArtifactPut", 5, digest, 0, len(blob), bytes(chunk + 1)))
    (err,) = raw.replies("Error")
    assert (err["code"], err["request_id"]) == (ERR["JOB"], 5) and str(chunk) in err["message"]


def test_server_status_has_the_documented_limits_and_traffic(server: Daemon) -> None:
    """Section 4: StatusInfo's JSON ``limits`` and ``traffic`` keys (the server's own key
    is an admin)."""
    import json

    admin = Raw(server, server.data_dir / "key")
    admin.hello()
    admin.send(msg("ServerStatus", 1))
    (info,) = admin.replies("StatusInfo")
    status = json.loads(info["info"])
    assert set(status["limits"]) == {"max_sessions", "session_memory", "memory_limit"}
    assert set(status["traffic"]) == {"steps", "bytes_received", "bytes_sent", "messages"}
    assert all(isinstance(v, int) for v in status["traffic"].values())
    admin.close()


def test_a_job_list_page_is_json_with_jobs_and_next(raw: Raw) -> None:
    """Section 8: JobList's JobInfo holds {"jobs": [...], "next": id or null}."""
    import json

    raw.send(msg("JobList", 1, 0, 0))
    (info,) = raw.replies("JobInfo")
    page = json.loads(info["info"])
    assert set(page) == {"jobs", "next"} and page["next"] is None
    assert isinstance(page["jobs"], list)
