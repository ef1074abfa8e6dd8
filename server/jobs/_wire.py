"""The job and artifact messages, handled inside a client's session (``server/_session.py``
registers :data:`JOB_HANDLERS` beside its own handlers).

Each handler answers with one reply, or raises an Error(JOB) whose text is for the user
(a spec error names the key path). JobWatch is a long poll: it blocks this session's worker
thread for at most ``WATCH_WAIT`` seconds, never the network loop or other sessions.
"""

from __future__ import annotations

import json
from typing import Any

from ...protocol import messages as m
from ._service import JobRefused, JobService
from ._store import StoreError


def _refuse(text: str) -> Exception:
    from .._session import _Failure

    return _Failure(m.JOB, text)


def _service(session: Any) -> JobService:
    service = getattr(session.state, "jobs", None)
    if service is None:
        raise _refuse("jobs are not enabled on this server (start it with --data-dir)")
    return service


def _info(session: Any, request_id: int, call: Any, *args: Any) -> None:
    try:
        result = call(*args)
    except (JobRefused, StoreError) as exc:
        raise _refuse(str(exc)) from None
    session._replies.append(m.JobInfo(request_id, json.dumps(result).encode()))


def _submit(session: Any, msg: m.JobSubmit) -> None:
    if len(msg.spec) > m.MAX_SPEC:
        raise _refuse(f"spec: {len(msg.spec)} bytes exceed MAX_SPEC {m.MAX_SPEC}")
    try:
        spec = json.loads(msg.spec)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _refuse(f"spec: not valid JSON: {exc}") from None
    _info(session, msg.request_id, _service(session).submit, spec)


def _list(session: Any, msg: m.JobList) -> None:
    _info(session, msg.request_id, _service(session).list)


def _status(session: Any, msg: m.JobStatus) -> None:
    _info(session, msg.request_id, _service(session).status, msg.job_id)


def _cancel(session: Any, msg: m.JobCancel) -> None:
    _info(session, msg.request_id, _service(session).cancel, msg.job_id)


def _watch(session: Any, msg: m.JobWatch) -> None:
    try:
        events = _service(session).wait_events(msg.job_id, msg.after)
    except JobRefused as exc:
        raise _refuse(str(exc)) from None
    session._replies.append(m.JobEvents(msg.request_id, msg.job_id, json.dumps(events).encode()))


def _put(session: Any, msg: m.ArtifactPut) -> None:
    if len(msg.data) > m.ARTIFACT_CHUNK:
        raise _refuse(f"artifact chunk of {len(msg.data)} bytes exceeds {m.ARTIFACT_CHUNK}")
    if len(msg.digest) != 32:
        raise _refuse("artifact digest must be 32 bytes (sha256)")
    try:
        _service(session).store.receive_chunk(msg.digest.hex(), msg.offset, msg.total, msg.data)
    except StoreError as exc:
        raise _refuse(str(exc)) from None
    session._replies.append(m.Ack(msg.request_id))


def _get(session: Any, msg: m.ArtifactGet) -> None:
    sha = msg.digest.hex()
    try:
        total, data = _service(session).store.read_chunk(
            sha, msg.offset, min(msg.length, m.ARTIFACT_CHUNK)
        )
    except StoreError as exc:
        raise _refuse(str(exc)) from None
    session._replies.append(m.ArtifactChunk(msg.request_id, msg.digest, msg.offset, total, data))


JOB_HANDLERS: dict[type, Any] = {
    m.JobSubmit: _submit,
    m.JobList: _list,
    m.JobStatus: _status,
    m.JobCancel: _cancel,
    m.JobWatch: _watch,
    m.ArtifactPut: _put,
    m.ArtifactGet: _get,
}

__all__ = ["JOB_HANDLERS"]
