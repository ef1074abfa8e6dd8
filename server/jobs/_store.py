"""The durable job store: SQLite (WAL) in the data directory, plus content-addressed files.

Rows hold what must survive a crash: each job's validated spec (JSON), state, step, latest
checkpoint and outputs; its progress events; the artifacts known by sha256. Artifact bytes
live in ``artifacts/<aa>/<sha256>`` and checkpoints in ``checkpoints/<job>/``, always written
as temp file + fsync + rename, so a crash or a full disk leaves the old file or the new one,
never half of one. The schema is versioned: ``migrations`` lists the applied versions and
:data:`MIGRATIONS` is applied in order at open. Thread-safe (one connection, one lock).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...protocol.messages_jobs import JOB_EVENTS_PAGE

DB_NAME = "jobs.sqlite3"
STATES = ("queued", "running", "succeeded", "failed", "cancelled")
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})

MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        kind TEXT NOT NULL,
        device TEXT NOT NULL,
        state TEXT NOT NULL,
        spec TEXT NOT NULL,
        created REAL NOT NULL,
        started REAL,
        finished REAL,
        error TEXT,
        step INTEGER NOT NULL DEFAULT 0,
        total INTEGER NOT NULL DEFAULT 0,
        checkpoint TEXT,
        checkpoint_step INTEGER NOT NULL DEFAULT 0,
        outputs TEXT NOT NULL DEFAULT '{}',
        cancel_requested INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX jobs_queue ON jobs (device, state, id);
    CREATE TABLE events (
        job_id INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        data TEXT NOT NULL,
        PRIMARY KEY (job_id, seq)
    );
    CREATE TABLE artifacts (
        sha256 TEXT PRIMARY KEY,
        size INTEGER NOT NULL,
        created REAL NOT NULL
    );
    """,
    """
    ALTER TABLE jobs ADD COLUMN owner TEXT NOT NULL DEFAULT '';
    CREATE INDEX jobs_owner ON jobs (owner, id);
    CREATE TABLE artifact_owners (
        sha256 TEXT NOT NULL,
        owner TEXT NOT NULL,
        PRIMARY KEY (sha256, owner)
    );
    """,
)
"""Schema versions 1..N; append, never edit, so older data directories upgrade in place."""


class StoreError(Exception):
    """A store operation failed (unknown job or artifact, checksum mismatch, disk full)."""


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` so that ``path`` holds either its old content or all of the new."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class JobStore:
    """Jobs, events and artifacts of one data directory."""

    def __init__(self, data_dir: str | Path) -> None:
        self.root = Path(data_dir)
        for sub in ("artifacts", "uploads", "checkpoints", "work"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()
        self.path = self.root / DB_NAME
        self.backup_path = self.root / f"{DB_NAME}.bak"
        existed = self.path.exists()
        if existed and self.path.stat().st_size == 0:
            self._refuse("is empty (0 bytes)")
        self.db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            self.db.row_factory = sqlite3.Row
            self.db.execute("PRAGMA busy_timeout=10000")
            if existed:
                check = self.db.execute("PRAGMA quick_check").fetchone()[0]
                if check != "ok":
                    self._refuse(f"failed SQLite's integrity check ({check})")
                if not self._has_tables():
                    self._refuse("holds no job tables (not a burn-remote job store)")
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            self.db.close()
            self._refuse(f"cannot be read as an SQLite database ({exc})")
        except StoreError:
            self.db.close()
            raise
        self.backup()

    def _refuse(self, why: str) -> None:
        """One line: what is wrong, and how to get the jobs back (never a silent new store)."""
        if self.backup_path.exists():
            fix = (
                f"restore the backup written at the last good start: "
                f"cp {self.backup_path} {self.path}"
            )
        else:
            fix = f"no backup at {self.backup_path}; restore {self.path} from your own backup"
        raise StoreError(
            f"job store {self.path} {why}; refusing to start rather than lose its jobs: {fix} "
            f"(or move it away to start an empty store)"
        )

    def _has_tables(self) -> bool:
        names = {r[0] for r in self.db.execute("SELECT name FROM sqlite_master")}
        return {"migrations", "jobs", "events", "artifacts"} <= names

    def backup(self) -> None:
        """Copy the store to ``jobs.sqlite3.bak`` (SQLite's online backup: a consistent
        snapshot); done at every start, after the integrity check passed."""
        tmp = self.backup_path.with_name(self.backup_path.name + ".tmp")
        try:
            with self.lock:
                dest = sqlite3.connect(tmp)
                try:
                    self.db.backup(dest)
                finally:
                    dest.close()
            os.replace(tmp, self.backup_path)
        except (sqlite3.Error, OSError):  # a full disk must not stop the server: no backup
            with contextlib.suppress(OSError):
                tmp.unlink()

    def _migrate(self) -> None:
        with self._tx() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS migrations (version INTEGER PRIMARY KEY, at REAL)"
            )
            done = {r[0] for r in db.execute("SELECT version FROM migrations")}
            for version, sql in enumerate(MIGRATIONS, 1):
                if version not in done:
                    for stmt in filter(str.strip, sql.split(";")):
                        db.execute(stmt)
                    db.execute("INSERT INTO migrations VALUES (?, ?)", (version, time.time()))

    @property
    def schema_version(self) -> int:
        return int(self.db.execute("SELECT MAX(version) FROM migrations").fetchone()[0])

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")

    def close(self) -> None:
        with self.lock:
            self.db.close()

    # --- jobs -------------------------------------------------------------------------------
    def add_job(self, spec: dict[str, Any], device: str, total: int, owner: str = "") -> int:
        """Queue a job owned by peer ``owner`` (only it, and admins, see the job)."""
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO jobs (kind, device, state, spec, created, total, owner) "
                "VALUES (?,?,?,?,?,?,?)",
                (spec["kind"], device, "queued", json.dumps(spec), time.time(), total, owner),
            )
            job_id = int(cur.lastrowid or 0)
            _insert_event(db, job_id, {"state": "queued"})  # one transaction: both or neither
        return job_id

    def job(self, job_id: int) -> dict[str, Any]:
        with self.lock:
            row = self.db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise StoreError(f"job {job_id}: no such job")
        return _row(row)

    def jobs(self, owner: str | None = None) -> list[dict[str, Any]]:
        """Every job, oldest first; with ``owner``, only that peer's."""
        with self.lock:
            if owner is None:
                rows = self.db.execute("SELECT * FROM jobs ORDER BY id").fetchall()
            else:
                rows = self.db.execute(
                    "SELECT * FROM jobs WHERE owner = ? ORDER BY id", (owner,)
                ).fetchall()
        return [_row(r) for r in rows]

    def counts(self) -> dict[str, int]:
        """Jobs by state (every state listed, zeros included)."""
        with self.lock:
            rows = self.db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall()
        found = {state: int(n) for state, n in rows}
        return {state: found.get(state, 0) for state in STATES}

    def active_jobs(self, owner: str) -> int:
        """How many of ``owner``'s jobs are queued or running."""
        with self.lock:
            row = self.db.execute(
                "SELECT COUNT(*) FROM jobs WHERE owner = ? AND state IN ('queued', 'running')",
                (owner,),
            ).fetchone()
        return int(row[0])

    def jobs_page(self, after: int, limit: int, owner: str | None = None) -> list[dict[str, Any]]:
        """Up to ``limit`` jobs with ids above ``after``, oldest first (with ``owner``, only
        that peer's)."""
        with self.lock:
            if owner is None:
                rows = self.db.execute(
                    "SELECT * FROM jobs WHERE id > ? ORDER BY id LIMIT ?", (after, limit)
                ).fetchall()
            else:
                rows = self.db.execute(
                    "SELECT * FROM jobs WHERE owner = ? AND id > ? ORDER BY id LIMIT ?",
                    (owner, after, min(limit, 2**62)),
                ).fetchall()
        return [_row(r) for r in rows]

    def next_queued(self, device: str) -> dict[str, Any] | None:
        with self.lock:
            row = self.db.execute(
                "SELECT * FROM jobs WHERE device = ? AND state = 'queued' ORDER BY id LIMIT 1",
                (device,),
            ).fetchone()
        return None if row is None else _row(row)

    def update(self, job_id: int, **fields: Any) -> None:
        if "outputs" in fields:
            fields["outputs"] = json.dumps(fields["outputs"])
        cols = ", ".join(f"{k} = ?" for k in fields)
        with self._tx() as db:
            db.execute(f"UPDATE jobs SET {cols} WHERE id = ?", (*fields.values(), job_id))

    def requeue_interrupted(self, device: str) -> list[int]:
        """Jobs left running by a crash go back to the queue (they resume from a checkpoint)."""
        with self._tx() as db:
            ids = [
                r[0]
                for r in db.execute(
                    "SELECT id FROM jobs WHERE device = ? AND state = 'running'", (device,)
                )
            ]
            db.execute(
                "UPDATE jobs SET state = 'queued' WHERE device = ? AND state = 'running'", (device,)
            )
        for i in ids:
            self.add_event(i, {"state": "queued", "resumed": True})
        return ids

    # --- events -----------------------------------------------------------------------------
    def add_event(self, job_id: int, event: dict[str, Any]) -> int:
        with self._tx() as db:
            return _insert_event(db, job_id, event)

    def event_count(self, job_id: int) -> int:
        with self.lock:
            return int(
                self.db.execute(
                    "SELECT COUNT(*) FROM events WHERE job_id = ?", (job_id,)
                ).fetchone()[0]
            )

    def events(self, job_id: int, after: int, limit: int = JOB_EVENTS_PAGE) -> list[dict[str, Any]]:
        """At most ``limit`` events of ``job_id`` numbered above ``after``, oldest first."""
        with self.lock:
            rows = self.db.execute(
                "SELECT data FROM events WHERE job_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                (job_id, after, limit),
            ).fetchall()
        return [json.loads(r[0]) for r in rows]

    # --- artifacts --------------------------------------------------------------------------
    def artifact_path(self, sha: str) -> Path:
        return self.root / "artifacts" / sha[:2] / sha

    def has_artifact(self, sha: str) -> bool:
        with self.lock:
            row = self.db.execute("SELECT 1 FROM artifacts WHERE sha256 = ?", (sha,)).fetchone()
        return row is not None and self.artifact_path(sha).exists()

    def artifact_size(self, sha: str) -> int:
        with self.lock:
            row = self.db.execute("SELECT size FROM artifacts WHERE sha256 = ?", (sha,)).fetchone()
        if row is None:
            raise StoreError(f"artifact {sha[:16]}...: no such artifact")
        return int(row[0])

    def owns_artifact(self, sha: str, owner: str) -> bool:
        """Whether peer ``owner`` uploaded ``sha`` or a job of its produced it."""
        with self.lock:
            row = self.db.execute(
                "SELECT 1 FROM artifact_owners WHERE sha256 = ? AND owner = ?", (sha, owner)
            ).fetchone()
        return row is not None and self.artifact_path(sha).exists()

    def own_artifact(self, sha: str, owner: str) -> None:
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO artifact_owners VALUES (?, ?)", (sha, owner))

    def put_artifact(self, data: bytes, owner: str | None = None) -> str:
        """Store bytes (a job output) owned by ``owner``; returns their sha256."""
        sha = hashlib.sha256(data).hexdigest()
        if not self.has_artifact(sha):
            write_atomic(self.artifact_path(sha), data)
            self._record(sha, len(data))
        if owner is not None:
            self.own_artifact(sha, owner)
        return sha

    def put_artifact_file(self, path: Path, owner: str | None = None) -> str:
        return self.put_artifact(path.read_bytes(), owner)

    def upload_path(self, sha: str, owner: str) -> Path:
        """Where ``owner``'s half-received upload of ``sha`` grows: one file per peer, so no
        peer can append to, restart or complete another's upload."""
        return self.root / "uploads" / f"{owner or 'local'}-{sha}.part"

    def uploads_of(self, owner: str) -> list[Path]:
        """``owner``'s half-received uploads."""
        return sorted((self.root / "uploads").glob(f"{owner or 'local'}-*.part"))

    def disk_of(self, owner: str) -> int:
        """Bytes ``owner`` keeps here: artifacts it owns (shared content counts for each
        owner) and its half-received uploads."""
        with self.lock:
            row = self.db.execute(
                "SELECT COALESCE(SUM(a.size), 0) FROM artifact_owners o "
                "JOIN artifacts a ON a.sha256 = o.sha256 WHERE o.owner = ?",
                (owner,),
            ).fetchone()
        parts = 0
        for part in self.uploads_of(owner):
            with contextlib.suppress(OSError):
                parts += part.stat().st_size
        return int(row[0]) + parts

    def drop_uploads(self, owner: str | None = None, older_than: float | None = None) -> int:
        """Remove half-received uploads (``owner``'s, or everyone's; with ``older_than``,
        only those untouched for that many seconds). Returns how many were removed."""
        pattern = f"{owner or 'local'}-*.part" if owner is not None else "*.part"
        now, removed = time.time(), 0
        for part in (self.root / "uploads").glob(pattern):
            try:
                if older_than is not None and now - part.stat().st_mtime < older_than:
                    continue
                part.unlink()
                removed += 1
            except OSError:
                continue
        return removed

    def receive_chunk(
        self, sha: str, offset: int, total: int, data: bytes, owner: str = ""
    ) -> bool:
        """Append an uploaded chunk; on the last one check the sha256 and store the artifact,
        owned by ``owner``. Returns True once the artifact is stored. A bad offset or checksum
        raises StoreError and discards the partial upload; a full disk raises StoreError too.

        Content already stored under another owner is not shared on the strength of its
        hash: the peer uploads every byte and the checksum is verified before it owns it."""
        if self.owns_artifact(sha, owner):
            return offset + len(data) >= total
        part = self.upload_path(sha, owner)
        try:
            have = part.stat().st_size if part.exists() else 0
            if offset == 0 and have:
                part.unlink()
                have = 0
            if offset != have:
                raise StoreError(f"artifact {sha[:16]}...: chunk at {offset}, expected {have}")
            if offset + len(data) > total:
                raise StoreError(f"artifact {sha[:16]}...: chunks exceed the declared {total}")
            with open(part, "ab") as f:
                f.write(data)
                if offset + len(data) == total:
                    f.flush()
                    os.fsync(f.fileno())
            if offset + len(data) < total:
                return False
            actual = _sha256_file(part)
            if actual != sha:
                raise StoreError(
                    f"artifact checksum mismatch: declared sha256 {sha[:16]}..., "
                    f"the uploaded bytes hash to {actual[:16]}..."
                )
            dest = self.artifact_path(sha)
            if self.has_artifact(sha):  # the same bytes, proven by this peer: share the file
                part.unlink()
            else:
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(part, dest)
                fsync_dir(dest.parent)
                self._record(sha, total)
            self.own_artifact(sha, owner)
            return True
        except StoreError:
            with contextlib.suppress(OSError):
                part.unlink()
            raise
        except OSError as exc:
            with contextlib.suppress(OSError):
                part.unlink()
            raise StoreError(f"artifact {sha[:16]}...: could not store: {exc}") from None

    def _record(self, sha: str, size: int) -> None:
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO artifacts VALUES (?, ?, ?)", (sha, size, time.time()))

    def read_chunk(self, sha: str, offset: int, length: int) -> tuple[int, bytes]:
        """(total size, bytes from offset); the bytes are as stored (the reader verifies)."""
        total = self.artifact_size(sha)
        path = self.artifact_path(sha)
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                return total, f.read(length)
        except OSError as exc:
            raise StoreError(f"artifact {sha[:16]}...: cannot read: {exc}") from None

    def verified_path(self, sha: str) -> Path:
        """The artifact's file after checking its bytes still hash to ``sha``."""
        path = self.artifact_path(sha)
        if not self.has_artifact(sha):
            raise StoreError(f"artifact {sha[:16]}...: no such artifact")
        actual = _sha256_file(path)
        if actual != sha:
            raise StoreError(
                f"artifact {sha[:16]}... is corrupted on the server: its bytes hash to "
                f"{actual[:16]}..."
            )
        return path


def _insert_event(db: sqlite3.Connection, job_id: int, event: dict[str, Any]) -> int:
    seq = db.execute(
        "SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE job_id = ?", (job_id,)
    ).fetchone()[0]
    event = {"seq": seq, "job_id": job_id, "time": time.time(), **event}
    db.execute("INSERT INTO events VALUES (?, ?, ?)", (job_id, seq, json.dumps(event)))
    return int(seq)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _row(row: sqlite3.Row) -> dict[str, Any]:
    d = dict(row)
    d["spec"] = json.loads(d["spec"])
    d["outputs"] = json.loads(d["outputs"])
    d["cancel_requested"] = bool(d["cancel_requested"])
    return d


__all__ = ["STATES", "TERMINAL", "JobStore", "StoreError", "write_atomic"]
