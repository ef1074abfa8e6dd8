"""JobService: the job store plus one runner thread for the server's device.

Jobs queue per device and run one at a time, in submission order, on a local ``Device``
whose runtime is the server's own engine (``_runtime.JobRuntime``: the sessions' backend,
plan cache, memory ledger and limits), so nn/optim/lora work as in user code. The runner
writes progress events to the store and wakes long-polling watchers; a running job checks
for cancellation and shutdown between steps. At start, jobs a crash left ``running`` are
queued again and resume from their last checkpoint.
"""

from __future__ import annotations

import builtins
import errno
import json
import logging
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...protocol import messages as m
from .._state import ServerState
from ._checkpoint import choose, prune, seal
from ._disk import NoRoom, check_room
from ._preflight import preflight
from ._spec import SpecError, refs, validate
from ._store import TERMINAL, JobStore, StoreError

log = logging.getLogger("burn_remote.server.jobs")

RETRY_MIN, RETRY_MAX = 0.5, 30.0
"""Seconds the runner pauses after a storage error, doubling up to the maximum."""

STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})
"""OS errors that are the disk's, not the job's: the job is retried, not failed."""


def is_storage_error(exc: BaseException) -> bool:
    """A full, read-only or failing disk (OSError) or SQLite store ("database or disk is
    full", "disk I/O error")."""
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc)
        return "full" in text or "disk I/O" in text or "readonly" in text
    if isinstance(exc, StoreError) and isinstance(exc.__context__, OSError):
        return is_storage_error(exc.__context__)
    return isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS


UPLOAD_TTL = 3600.0
"""Seconds a half-received upload may sit untouched before it is removed."""
MAX_PEER_UPLOADS = 8
"""Half-received uploads one peer may have at a time."""

PROGRESS_EVENTS = 1000
"""Progress events one job stores at most: one every ceil(steps / PROGRESS_EVENTS) steps, and
the last. (One a step, a job of 10^7 steps, within its spec's bounds, wrote 10^7 rows to the
job store; a progress bar needs far fewer.)"""
MAX_JOB_EVENTS = 3 * PROGRESS_EVENTS
"""Events of any kind a running job stores (progress, checkpoints, messages); state changes
(queued, cancelled, failed, succeeded) are stored beyond it."""

WATCH_WAIT = 2.0
"""Seconds a JobWatch long poll waits for a new event before answering with none."""


USER_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,  # SpecError, ExportError, HFConfigError, CheckpointError: named inputs
    FloatingPointError,  # the loss diverged: the spec's learning rate, not the server
    ConnectionError,  # a server the spec names cannot be reached or was lost
    ModuleNotFoundError,  # an extra this server lacks (onnx): the message says what to install
)
"""A job's failures that come from what the user asked (the message names the key or the
file), logged as one WARNING line; anything else is a fault of ours: ERROR and traceback."""


class JobRefused(Exception):
    """A request about jobs failed; the message is for the client (spec key path included)."""


class _Stop(BaseException):
    """Raised inside a running job by ``check``: cancelled (``cancel``) or server shutdown."""

    def __init__(self, cancel: bool) -> None:
        super().__init__("cancelled" if cancel else "shutdown")
        self.cancel = cancel


class JobContext:
    """What a job kind sees: its spec, device, folders, inputs, progress and checkpoints."""

    def __init__(self, service: JobService, job: dict[str, Any], device: Any) -> None:
        self.service, self.job, self.device = service, job, device
        self.key_path: Path | None = service.key_path
        """The server's own key: how a data-parallel job dials the servers it names."""
        self.id: int = job["id"]
        self.spec: dict[str, Any] = job["spec"]
        self.work = service.store.root / "work" / str(self.id)
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True)
        self.checkpoints = service.store.root / "checkpoints" / str(self.id)
        self._stored = service.store.event_count(self.id)
        """Events this job has stored (a resumed job's earlier ones included)."""
        choice = choose(self.checkpoints)
        self.checkpoint: Path | None = choice.path
        """The newest checkpoint that passed its checksum (None: start from step 0)."""
        for line in choice.skipped:  # said out loud: the job falls back, never silently
            log.warning("job %d: %s", self.id, line, extra={"event": "checkpoint_damaged"})
            self.log(line)
        if choice.skipped:
            self.log(
                f"falling back to {choice.path.name}" if choice.path else "starting from step 0"
            )
        self._t0, self._s0, self._last = time.monotonic(), 0, 0.0

    def resolve(self, ref: str, key: str) -> Any:
        return self.service.resolve(ref, key)

    def log(self, text: str) -> None:
        self._running({"state": "running", "message": text})

    def _running(self, event: dict[str, Any]) -> None:
        """Store an event of the running job, up to MAX_JOB_EVENTS of them: past it, one
        notice, then nothing more until the job's state changes (those are always stored);
        the job's row keeps its step either way (``jobs status``)."""
        if self._stored > MAX_JOB_EVENTS:
            return
        if self._stored == MAX_JOB_EVENTS:
            event = {
                "state": "running",
                "message": f"this job stored {MAX_JOB_EVENTS} events (MAX_JOB_EVENTS): no more "
                "progress events; `burn-remote jobs status` shows its step",
            }
        self._stored += 1
        self.service._event(self.id, event)

    def started(self, step: int) -> None:
        self._t0, self._s0 = time.monotonic(), step

    def check(self) -> None:
        if self.id in self.service._cancel:
            raise _Stop(True)
        if self.service._stopping.is_set():
            raise _Stop(False)

    def progress(self, step: int, loss: float | None) -> None:
        total = self.job["total"]
        elapsed = max(time.monotonic() - self._t0, 1e-9)
        rate = (step - self._s0) / elapsed
        event = {
            "state": "running",
            "step": step,
            "total": total,
            "loss": loss,
            "steps_per_s": rate,
            "eta_s": (total - step) / rate if rate > 0 else None,
        }
        self.service.store.update(self.id, step=step)
        stride = -(-total // PROGRESS_EVENTS) if total > 0 else 1
        if step % stride == 0 or step >= total:
            self._running(event)

    def save_checkpoint(self, step: int, write: Callable[[Path], None]) -> None:
        """Write a new checkpoint atomically, seal it with its checksum, record it, then drop
        all but the last KEEP."""
        folder = self.checkpoints
        path = folder / f"step-{step:09d}.safetensors"
        write(path)
        path = seal(path)
        self.service.store.update(self.id, checkpoint=str(path), checkpoint_step=step)
        prune(folder)
        self._running({"state": "running", "checkpoint": step})


class JobService:
    """The jobs of one server: submit, list, cancel, watch; runs them on ``device``."""

    def __init__(
        self,
        data_dir: str | Path,
        engine: ServerState | str = "cpu",
        job_paths: list[str] | None = None,
        key_path: str | Path | None = None,
    ) -> None:
        """``engine``: the server's state (jobs share its engine), or a device string for a
        job service of its own (tests, tools). ``key_path``: the server's identity, which
        data-parallel jobs dial other servers with (None: the default key)."""
        self.state = engine if isinstance(engine, ServerState) else ServerState(engine)
        self.store = JobStore(data_dir)
        self.device = self.state.device
        self.job_paths = [Path(p).resolve() for p in job_paths or []]
        self.key_path = Path(key_path) if key_path is not None else None
        self.changed = threading.Condition()
        self._cancel: set[int] = set()
        self._stopping = threading.Event()
        self._stalled = False
        self.running: Any = None
        """The running job's runtime (its memory), or None."""
        self.storage_error: str | None = None
        """The storage error the runner is waiting out, or None (health and status)."""
        resumed = self.store.requeue_interrupted(self.device)
        if resumed:
            log.info(
                "jobs %s were interrupted; queued again to resume",
                resumed,
                extra={"event": "jobs_requeued"},
            )
        self._thread = threading.Thread(target=self._loop, name=f"jobs-{self.device}", daemon=True)
        self._thread.start()

    # --- requests ---------------------------------------------------------------------------
    # ``owner`` is the asking peer's id: a peer sees and touches only its own jobs and
    # artifacts, an ``admin`` every peer's, an in-process caller (owner None) everything.
    # Another peer's job is answered exactly like a job that does not exist.

    def submit(
        self, spec: dict[str, Any] | str, owner: str | None = None, admin: bool = False
    ) -> dict[str, Any]:
        try:
            spec = validate(spec)
            for key, ref in refs(spec):
                self.resolve(ref, key, check_only=True, owner=owner, admin=admin)
        except SpecError as exc:
            raise self._refused(exc) from None
        try:  # a job writes checkpoints, events and outputs: none while the disk is full
            check_room(self.store.root, 0, self.state.limits.disk_limit, "job")
        except NoRoom as exc:
            raise JobRefused(str(exc)) from None
        if owner is not None:
            kept, quota = self.store.disk_of(owner), self.state.limits.peer_disk
            if kept >= quota:  # a job's outputs and checkpoints would add to it
                raise JobRefused(
                    f"you keep {kept} bytes on this server, at your disk quota {quota} "
                    "(--peer-disk); nothing was queued"
                )
            active = self.store.active_jobs(owner)
            if active >= self.state.limits.max_peer_jobs:
                raise JobRefused(
                    f"you have {active} jobs queued or running on this server "
                    f"(max_peer_jobs {self.state.limits.max_peer_jobs}); wait for one to end"
                )
        try:  # last: it reads the files' headers (and a text data set's characters)
            spec = preflight(
                spec, lambda ref, key: self.resolve(ref, key, owner=owner, admin=admin)
            )
        except SpecError as exc:
            raise self._refused(exc) from None
        total = spec.get("steps", 1)
        try:
            job_id = self.store.add_job(spec, self.device, total, owner or "")
        except (sqlite3.Error, OSError) as exc:
            raise JobRefused(
                f"the server's job store cannot be written ({exc}); nothing was queued: "
                "try again once the server has disk space"
            ) from None
        log.info(
            "job %d queued (%s)", job_id, spec["kind"], extra={"event": "job_queued", "job": job_id}
        )
        self._wake()
        return self.status(job_id)

    @staticmethod
    def _refused(exc: SpecError) -> JobRefused:
        """A spec refused: one WARNING line for the operator, the whole text for the user."""
        log.warning("job refused: %s", str(exc).replace("\n", "; "), extra={"event": "job_refused"})
        return JobRefused(str(exc))

    def _job(self, job_id: int, owner: str | None, admin: bool) -> dict[str, Any]:
        if not 0 < job_id < 2**63:  # SQLite's integers end there
            raise JobRefused(f"job {job_id}: no such job")
        try:
            job = self.store.job(job_id)
        except StoreError as exc:
            raise JobRefused(str(exc)) from None
        if owner is not None and not admin and job["owner"] != owner:
            raise JobRefused(f"job {job_id}: no such job")
        return job

    def status(self, job_id: int, owner: str | None = None, admin: bool = False) -> dict[str, Any]:
        return _public(self._job(job_id, owner, admin))

    def page(
        self, after: int = 0, limit: int = 0, owner: str | None = None, admin: bool = False
    ) -> dict[str, Any]:
        """One JobList page: at most ``limit`` (or JOB_PAGE) jobs above ``after``, cut short
        where the JSON would pass half the server's frame limit; ``next`` is where the next
        page starts. Only
        the asking peer's jobs (an admin's or in-process caller's: every job)."""
        limit = min(limit or m.JOB_PAGE, m.JOB_PAGE)
        mine = None if owner is None or admin else owner
        rows = self.store.jobs_page(after, limit + 1, mine)
        jobs: list[dict[str, Any]] = []
        size = 0
        for row in rows[:limit]:
            job = _public(row)
            size += len(json.dumps(job))
            if jobs and size > self.state.limits.max_frame // 2:
                break
            jobs.append(job)
        more = len(jobs) < len(rows)
        return {"jobs": jobs, "next": jobs[-1]["id"] if more and jobs else None}

    def list(self, owner: str | None = None, admin: bool = False) -> list[dict[str, Any]]:
        """The asking peer's jobs (an admin's or in-process caller's: every job)."""
        mine = None if owner is None or admin else owner
        return [_public(j) for j in self.store.jobs(mine)]

    def cancel(self, job_id: int, owner: str | None = None, admin: bool = False) -> dict[str, Any]:
        job = self.status(job_id, owner, admin)
        if job["state"] == "queued":
            self.store.update(job_id, state="cancelled", finished=time.time())
            self._event(job_id, {"state": "cancelled"})
        elif job["state"] == "running":
            self.store.update(job_id, cancel_requested=1)
            self._cancel.add(job_id)
        return self.status(job_id)

    def wait_events(
        self,
        job_id: int,
        after: int,
        timeout: float = WATCH_WAIT,
        owner: str | None = None,
        admin: bool = False,
    ) -> builtins.list[Any]:  # (`list` here is the method above)
        """One JobEvents page: the events numbered above ``after``, oldest first, at most
        JOB_EVENTS_PAGE of them and cut short where the JSON would pass half the server's
        frame limit (at least one, however large: a frame the client cannot take ends its
        session). Waits up to ``timeout`` for the first one; [] when none came."""
        self.status(job_id, owner, admin)
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                events = self.store.events(job_id, after, m.JOB_EVENTS_PAGE)
                left = deadline - time.monotonic()
                if events or left <= 0:
                    break
                self.changed.wait(left)
        size, budget = 0, self.state.limits.max_frame // 2
        for n, event in enumerate(events):
            size += len(json.dumps(event)) + 1
            if n and size > budget:
                return events[:n]
        return events

    def receive_upload(self, sha: str, offset: int, total: int, data: bytes, owner: str) -> bool:
        """One chunk of ``owner``'s upload, within its limits: at most MAX_PEER_UPLOADS half
        uploads at a time, and ``peer_disk`` bytes of artifacts and uploads in all. Half
        uploads untouched for UPLOAD_TTL seconds are removed (any peer's)."""
        store, limits = self.store, self.state.limits
        store.drop_uploads(older_than=UPLOAD_TTL)
        if offset == 0 and not store.owns_artifact(sha, owner):
            part = store.upload_path(sha, owner)
            if not part.exists() and len(store.uploads_of(owner)) >= MAX_PEER_UPLOADS:
                raise JobRefused(
                    f"you have {MAX_PEER_UPLOADS} uploads under way on this server "
                    f"(MAX_PEER_UPLOADS); finish or abandon one first"
                )
            have = part.stat().st_size if part.exists() else 0
            used = store.disk_of(owner) - have
            if used + total > limits.peer_disk:
                raise JobRefused(
                    f"artifact of {total} bytes refused: you keep {used} bytes on this server "
                    f"and the per-peer disk quota is {limits.peer_disk} (--peer-disk)"
                )
            try:
                check_room(
                    store.root, total - have, limits.disk_limit, f"artifact of {total} bytes"
                )
            except NoRoom as exc:
                raise JobRefused(str(exc)) from None
        try:
            return store.receive_chunk(sha, offset, total, data, owner)
        except StoreError as exc:
            raise JobRefused(str(exc)) from None

    def can_read_artifact(self, sha: str, owner: str | None, admin: bool = False) -> bool:
        return owner is None or admin or self.store.owns_artifact(sha, owner)

    def resolve(
        self,
        ref: str,
        key: str,
        check_only: bool = False,
        owner: str | None = None,
        admin: bool = False,
    ) -> Any:
        """A reference to a local path (``job:<id>``: that job's outputs as name -> path).
        With ``owner``, only what that peer may use (see above) resolves."""
        kind, _, rest = ref.partition(":")
        try:
            if kind == "sha256":
                if not self.can_read_artifact(rest, owner, admin):
                    raise SpecError(f"{key}: no artifact {rest[:16]}... (upload it first)")
                if check_only:
                    if not self.store.has_artifact(rest):
                        raise SpecError(f"{key}: no artifact {rest[:16]}... (upload it first)")
                    return None
                return self.store.verified_path(rest)
            if kind == "server":
                if "\0" in rest:
                    raise SpecError(f"{key}: a path cannot contain a NUL byte")
                path = Path(rest).resolve()
                if not any(path.is_relative_to(d) for d in self.job_paths):
                    raise SpecError(f"{key}: {rest} is not under a --job-path directory")
                if key == "model.base":  # a save_pretrained directory
                    if not path.is_dir():
                        raise SpecError(f"{key}: {rest} is not a directory")
                elif not path.is_file():
                    raise SpecError(f"{key}: {rest} is not a file")
                return path
            try:
                job = self._job(int(rest), owner, admin)
            except JobRefused as exc:
                raise SpecError(f"{key}: {exc}") from None
            if job["state"] != "succeeded":
                raise SpecError(f"{key}: job {rest} has not succeeded (it is {job['state']})")
            files = {n: self.store.verified_path(sha) for n, sha in job["outputs"].items()}
            if key == "model.adapter":
                return files
            if "model.safetensors" not in files:
                raise SpecError(f"{key}: job {rest} has no model.safetensors output")
            return files["model.safetensors"]
        except StoreError as exc:
            raise SpecError(f"{key}: {exc}") from None

    # --- runner -----------------------------------------------------------------------------
    def _event(self, job_id: int, event: dict[str, Any]) -> None:
        self.store.add_event(job_id, event)
        with self.changed:
            self.changed.notify_all()

    def _wake(self) -> None:
        with self.changed:
            self.changed.notify_all()

    def _loop(self) -> None:
        """Run queued jobs until closed. A storage error (full disk, failing store) never
        ends this thread: the job goes back to the queue and the runner retries, pausing
        longer each time, until the store can be written again."""
        pause = RETRY_MIN
        while not self._stopping.is_set():
            try:
                if self._stalled:  # a job was left running by a storage error: queue it
                    self.store.requeue_interrupted(self.device)
                    self._stalled = False
                job = self.store.next_queued(self.device)
                if job is None:
                    with self.changed:
                        self.changed.wait(0.5)
                    continue
                self._run(job)
                pause = RETRY_MIN
            except Exception as exc:
                self._stalled = True
                self.storage_error = f"{type(exc).__name__}: {exc}"
                self.state.count_error("job_storage")
                log.error(
                    "job runner: cannot write the job store (%s); retrying in %.0f s",
                    self.storage_error,
                    pause,
                    extra={"event": "job_storage_error", "retry_s": pause},
                )
                self._stopping.wait(pause)
                pause = min(pause * 2, RETRY_MAX)
                continue
            self.storage_error = None

    def _run(self, job: dict[str, Any]) -> None:
        from ._runtime import JobRuntime

        job_id = job["id"]
        log.info(
            "job %d started (%s)",
            job_id,
            job["kind"],
            extra={"event": "job_started", "job": job_id, "kind": job["kind"]},
        )
        self.store.update(job_id, state="running", started=time.time())
        self._event(job_id, {"state": "running", "step": job["step"], "total": job["total"]})
        runtime = JobRuntime(self.state, f"job {job_id}")
        self.running = runtime
        try:
            self._attempt(job, runtime)
        finally:
            self.running = None

    def _attempt(self, job: dict[str, Any], runtime: Any) -> None:
        from burn_remote import Device

        from ._kinds import KINDS

        job_id = job["id"]
        try:
            try:
                ctx = JobContext(self, job, Device(self.device, runtime))
                files = KINDS[job["kind"]](ctx)
            finally:
                runtime.release()  # before the job's end is told: its memory is free then
            owner = job.get("owner") or ""
            outputs = {name: self.store.put_artifact_file(p, owner) for name, p in files.items()}
        except _Stop as stop:
            log.info(
                "job %d %s",
                job_id,
                "cancelled" if stop.cancel else "interrupted by shutdown (queued again)",
                extra={
                    "event": "job_cancelled" if stop.cancel else "job_interrupted",
                    "job": job_id,
                },
            )
            if stop.cancel:
                self._cancel.discard(job_id)
                self.store.update(job_id, state="cancelled", finished=time.time())
                self._event(job_id, {"state": "cancelled"})
            else:  # shutdown: queued again, resumes from its checkpoint at the next start
                self.store.update(job_id, state="queued")
                self._event(job_id, {"state": "queued", "interrupted": True})
            return
        except Exception as exc:
            if is_storage_error(exc):  # not the job's fault: it runs again when space returns
                raise
            error = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, USER_ERRORS):  # what the spec or its files asked: one line
                log.warning(
                    "job %d failed: %s",
                    job_id,
                    error.replace("\n", "; "),
                    extra={"event": "job_failed", "job": job_id},
                )
            else:  # a fault of ours: the traceback is what finds it
                log.exception("job %d failed", job_id, extra={"event": "job_failed", "job": job_id})
            self.store.update(job_id, state="failed", error=error, finished=time.time())
            self._event(job_id, {"state": "failed", "error": error})
            return
        log.info("job %d succeeded", job_id, extra={"event": "job_succeeded", "job": job_id})
        self.store.update(job_id, state="succeeded", outputs=outputs, finished=time.time())
        self._event(job_id, {"state": "succeeded", "outputs": outputs})
        shutil.rmtree(self.store.root / "work" / str(job_id), ignore_errors=True)

    def close(self, timeout: float = 30.0) -> None:
        """Stop the runner (a running job is queued again at its last checkpoint)."""
        self._stopping.set()
        self._wake()
        self._thread.join(timeout)
        self.store.close()


def _public(job: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in job.items() if k != "cancel_requested"}


__all__ = ["TERMINAL", "JobContext", "JobRefused", "JobService"]
