"""The job and artifact messages: their handlers, listed in the server's handler table
(``server/_handlers.py``) as :data:`JOB_HANDLERS`.

Each handler returns one reply, or raises a Failure(JOB) whose text is for the user (a spec
error names the key path). They run on a job worker thread (``Place.JOBS``), never on the
network loop: they touch SQLite and files, and JobWatch is a long poll that waits up to
``WATCH_WAIT`` seconds for an event.
"""

from __future__ import annotations

import json
from typing import Any

from ...protocol import messages as m
from .._replies import Failure, Handler, Place, Reply
from ._service import JobRefused, JobService
from ._store import StoreError


def _refuse(text: str) -> Exception:
    return Failure(m.JOB, text)


def _service(session: Any) -> JobService:
    service = getattr(session.state, "jobs", None)
    if service is None:
        raise _refuse("jobs are not enabled on this server (start it with --data-dir)")
    return service


def _me(session: Any) -> dict[str, Any]:
    """Who asks: the session's peer and whether the authorised-peers file makes it admin."""
    return {"owner": session.peer_id, "admin": session.state.is_admin(session.peer_id)}


def _info(session: Any, request_id: int, call: Any, *args: Any) -> Reply:
    try:
        result = call(*args, **_me(session))
    except (JobRefused, StoreError) as exc:
        raise _refuse(str(exc)) from None
    return [m.JobInfo(request_id, json.dumps(result).encode())]


def _submit(session: Any, msg: m.JobSubmit, now: float) -> Reply:
    if len(msg.spec) > m.MAX_SPEC:
        raise _refuse(f"spec: {len(msg.spec)} bytes exceed MAX_SPEC {m.MAX_SPEC}")
    try:
        spec = json.loads(msg.spec)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _refuse(f"spec: not valid JSON: {exc}") from None
    except RecursionError:
        raise _refuse("spec: nested too deeply") from None
    return _info(session, msg.request_id, _service(session).submit, spec)


def _list(session: Any, msg: m.JobList, now: float) -> Reply:
    return _info(session, msg.request_id, _service(session).page, msg.after, msg.limit)


def _status(session: Any, msg: m.JobStatus, now: float) -> Reply:
    return _info(session, msg.request_id, _service(session).status, msg.job_id)


def _cancel(session: Any, msg: m.JobCancel, now: float) -> Reply:
    return _info(session, msg.request_id, _service(session).cancel, msg.job_id)


def _watch(session: Any, msg: m.JobWatch, now: float) -> Reply:
    try:
        events = _service(session).wait_events(msg.job_id, msg.after, **_me(session))
    except JobRefused as exc:
        raise _refuse(str(exc)) from None
    return [m.JobEvents(msg.request_id, msg.job_id, json.dumps(events).encode())]


def _put(session: Any, msg: m.ArtifactPut, now: float) -> Reply:
    if len(msg.data) > m.ARTIFACT_CHUNK:
        raise _refuse(f"artifact chunk of {len(msg.data)} bytes exceeds {m.ARTIFACT_CHUNK}")
    if len(msg.digest) != 32:
        raise _refuse("artifact digest must be 32 bytes (sha256)")
    try:
        _service(session).receive_upload(
            msg.digest.hex(), msg.offset, msg.total, msg.data, session.peer_id
        )
    except (JobRefused, StoreError) as exc:
        raise _refuse(str(exc)) from None
    return [m.Ack(msg.request_id)]


def _get(session: Any, msg: m.ArtifactGet, now: float) -> Reply:
    sha = msg.digest.hex()
    service = _service(session)
    if not service.can_read_artifact(sha, **_me(session)):  # as if it did not exist
        raise _refuse(f"artifact {sha[:16]}...: no such artifact")
    if msg.offset >= 2**63:
        raise _refuse(f"artifact {sha[:16]}...: offset {msg.offset} is past any file")
    try:
        total, data = service.store.read_chunk(sha, msg.offset, min(msg.length, m.ARTIFACT_CHUNK))
    except StoreError as exc:
        raise _refuse(str(exc)) from None
    return [m.ArtifactChunk(msg.request_id, msg.digest, msg.offset, total, data)]


JOB_HANDLERS: dict[type, Handler] = {
    m.JobSubmit: Handler(_submit, Place.JOBS),
    m.JobList: Handler(_list, Place.JOBS),
    m.JobStatus: Handler(_status, Place.JOBS),
    m.JobCancel: Handler(_cancel, Place.JOBS),
    m.JobWatch: Handler(_watch, Place.JOBS),
    m.ArtifactPut: Handler(_put, Place.JOBS),
    m.ArtifactGet: Handler(_get, Place.JOBS),
}

__all__ = ["JOB_HANDLERS"]
