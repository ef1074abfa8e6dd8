"""Jobs and artifacts (server/jobs; tags 40..49 are reserved for them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .messages_base import WireMessage

JOB_PAGE = 100
"""Most jobs one JobList reply holds (a job row with its spec is at most ~MAX_SPEC bytes of
JSON, but specs are small in practice; the server also cuts a page at MAX_FRAME / 2 bytes)."""
JOB_EVENTS_PAGE = 1000
"""Most events one JobEvents reply holds (the server also cuts a page at max_frame / 2 bytes
of JSON, keeping at least one event): a job may store a few thousand, so a client reads them
page by page, asking again after the last ``seq`` it got."""
ARTIFACT_CHUNK = 1024 * 1024
"""Largest ``data`` of one ArtifactPut or ArtifactChunk (artifacts move in chunks inline)."""
MAX_SPEC = 1024 * 1024
"""Largest JSON job spec a server accepts."""


@dataclass(frozen=True, slots=True)
class JobSubmit(WireMessage):
    """Queue a job; answered by JobInfo (the new job) or Error(JOB) naming the bad key."""

    TAG: ClassVar[int] = 40
    request_id: int
    """Client-chosen id the reply repeats."""
    spec: bytes
    """The job spec as UTF-8 JSON (a TOML spec is parsed by the client); at most MAX_SPEC."""


@dataclass(frozen=True, slots=True)
class JobInfo(WireMessage):
    """Server -> client: answer to JobSubmit, JobList, JobStatus and JobCancel."""

    TAG: ClassVar[int] = 41
    request_id: int
    """The request's id."""
    info: bytes
    """UTF-8 JSON: one job (id, kind, state, step, total, outputs, error...) or, for JobList,
    an array of them."""


@dataclass(frozen=True, slots=True)
class JobList(WireMessage):
    """One page of the server's jobs, oldest first; answered by JobInfo whose ``info`` is
    ``{"jobs": [...], "next": ID or null}``: ask again with ``after = next`` for the next
    page (null: that was the last). Pages keep every reply under the frame limit."""

    TAG: ClassVar[int] = 42
    request_id: int
    """Client-chosen id the reply repeats."""
    after: int
    """List jobs with ids above this (0: from the first)."""
    limit: int
    """Jobs wanted (0 or more than the server's page size: the page size, JOB_PAGE)."""


@dataclass(frozen=True, slots=True)
class JobStatus(WireMessage):
    """One job's row; answered by JobInfo."""

    TAG: ClassVar[int] = 43
    request_id: int
    """Client-chosen id the reply repeats."""
    job_id: int
    """The job."""


@dataclass(frozen=True, slots=True)
class JobCancel(WireMessage):
    """Cancel a queued or running job (a running one stops at its next step and keeps its
    last checkpoint); answered by JobInfo."""

    TAG: ClassVar[int] = 44
    request_id: int
    """Client-chosen id the reply repeats."""
    job_id: int
    """The job."""


@dataclass(frozen=True, slots=True)
class JobWatch(WireMessage):
    """Long poll: answered by JobEvents as soon as the job has events numbered above
    ``after`` (or after a couple of seconds with none)."""

    TAG: ClassVar[int] = 45
    request_id: int
    """Client-chosen id the reply repeats."""
    job_id: int
    """The job."""
    after: int
    """The last event sequence number the client has seen (0: from the start)."""


@dataclass(frozen=True, slots=True)
class JobEvents(WireMessage):
    """Server -> client: answer to JobWatch."""

    TAG: ClassVar[int] = 46
    request_id: int
    """The JobWatch's id."""
    job_id: int
    """The job."""
    events: bytes
    """UTF-8 JSON array of events in order, each with ``seq``, ``state`` and, for progress,
    ``step``, ``total``, ``loss``, ``steps_per_s``, ``eta_s``."""


@dataclass(frozen=True, slots=True)
class ArtifactPut(WireMessage):
    """One chunk of an artifact upload, in order; every chunk is answered by Ack. The last
    chunk (``offset + len(data) == total``) is checked against ``digest`` before it is
    stored; a mismatch is refused with Error(JOB)."""

    TAG: ClassVar[int] = 47
    request_id: int
    """Client-chosen id the Ack repeats."""
    digest: bytes
    """sha256 (32 bytes) of the whole artifact; names it on the server."""
    offset: int
    """Where this chunk starts; chunks arrive in order from 0."""
    total: int
    """Size of the whole artifact."""
    data: bytes
    """At most ARTIFACT_CHUNK bytes."""


@dataclass(frozen=True, slots=True)
class ArtifactGet(WireMessage):
    """Read a chunk of a stored artifact (job input or output); answered by ArtifactChunk."""

    TAG: ClassVar[int] = 48
    request_id: int
    """Client-chosen id the reply repeats."""
    digest: bytes
    """sha256 of the artifact."""
    offset: int
    """First byte wanted."""
    length: int
    """Bytes wanted (the server sends at most ARTIFACT_CHUNK)."""


@dataclass(frozen=True, slots=True)
class ArtifactChunk(WireMessage):
    """Server -> client: answer to ArtifactGet; the client checks the sha256 of the whole."""

    TAG: ClassVar[int] = 49
    request_id: int
    """The ArtifactGet's id."""
    digest: bytes
    """sha256 the server holds the artifact under."""
    offset: int
    """Where ``data`` starts."""
    total: int
    """Size of the whole artifact."""
    data: bytes
    """The chunk."""


JOB_MESSAGES = (
    JobSubmit,
    JobInfo,
    JobList,
    JobStatus,
    JobCancel,
    JobWatch,
    JobEvents,
    ArtifactPut,
    ArtifactGet,
    ArtifactChunk,
)
"""The job and artifact messages (see server/jobs and protocol/README.md)."""


JOB_WIRE: tuple[type[WireMessage], ...] = (
    JobSubmit,
    JobInfo,
    JobList,
    JobStatus,
    JobCancel,
    JobWatch,
    JobEvents,
    ArtifactPut,
    ArtifactGet,
    ArtifactChunk,
)
"""Every message declared here, in tag order (``messages.MESSAGES`` joins the tables)."""
