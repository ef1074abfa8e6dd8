"""Remote jobs from the client: ``dev.jobs.submit(spec)`` on a RemoteDevice -> :class:`Job`.

A job runs on the server whether or not the client stays connected; the client submits it,
watches its progress events (a long poll per round trip), cancels it, and fetches its outputs
in chunks, checking each file's sha256. Local files named in a spec are uploaded first as
artifacts and replaced by their ``sha256:<hex>`` reference.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from burn_remote.protocol import messages as m

from ._recorder import OpFailed

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
_REF_PREFIXES = ("sha256:", "server:", "job:")
_FILE_KEYS = (
    ("model", "weights"),
    ("model", "hf_config"),
    ("model", "adapter"),
    ("model", "adapter_config"),
    ("data", "path"),
)


def _relative_to(spec: dict[str, Any], base: Path) -> None:
    """Local paths of a spec file, taken relative to the file's directory (as a user who
    keeps the spec next to its data expects), not to wherever the command runs."""
    for section, key in (*_FILE_KEYS, ("model", "base")):
        table = spec.get(section)
        if not isinstance(table, dict):
            continue
        value = table.get(key)
        if isinstance(value, str) and value and not value.startswith(_REF_PREFIXES):
            table[key] = str(base / Path(value).expanduser())


BASE_FILES = (
    "config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
)
"""What of a local model.base directory is uploaded (with the shards an index names)."""


def _base_files(directory: Path) -> dict[str, str]:
    """The files of a local save_pretrained directory that a job needs, name -> local path."""
    if not (directory / "config.json").is_file():
        raise JobError(f"model.base: {directory} has no config.json (a save_pretrained dir)")
    files = {n: str(directory / n) for n in BASE_FILES if (directory / n).is_file()}
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            if "/" in shard or not (directory / shard).is_file():
                raise JobError(f"model.base: {index} names {shard!r}, which is not beside it")
            files[shard] = str(directory / shard)
    elif "model.safetensors" not in files:
        raise JobError(f"model.base: {directory} has no model.safetensors (or an index)")
    return files


def _expand_pretrained(spec: dict[str, Any]) -> None:
    """model.weights naming a local save_pretrained directory: its weights and config.json
    travel as two files, and the directory's path is what the adapter names as its base."""
    model = spec.get("model")
    if not isinstance(model, dict):
        return
    base = model.get("base")
    if isinstance(base, str) and not base.startswith(_REF_PREFIXES):
        directory = Path(base).expanduser()
        model["base_files"] = _base_files(directory)  # uploaded in submit
        model.pop("base")
        model.setdefault("name_or_path", str(directory.resolve()))
    weights = model.get("weights")
    if not isinstance(weights, str) or weights.startswith(_REF_PREFIXES):
        return
    directory = Path(weights)
    if not directory.is_dir():
        return
    for name in ("model.safetensors", "config.json"):
        if not (directory / name).is_file():
            raise JobError(f"model.weights: {directory} has no {name} (a save_pretrained dir)")
    model["weights"] = str(directory / "model.safetensors")
    model.setdefault("hf_config", str(directory / "config.json"))
    model.setdefault("name_or_path", str(directory.resolve()))


RECONNECT_EVERY = 1.0
"""Seconds between a watcher's attempts to reach a restarting server."""

ARTIFACT_WINDOW = 16
"""Artifact chunks in flight at once (16 MiB): uploads and downloads cost a round trip per
window, not per chunk."""


def _sha256_of(path: Path) -> bytes:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(m.ARTIFACT_CHUNK):
            h.update(block)
    return h.digest()


def _to_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class JobError(RuntimeError):
    """The server refused a job request (the text names the spec key), or a job failed."""


class ChecksumError(JobError):
    """A fetched artifact's bytes do not hash to the sha256 the server holds it under."""


class Jobs:
    """The job API of one remote device (``dev.jobs``)."""

    def __init__(self, runtime: Any, reconnect: Callable[[], Any] | None = None) -> None:
        self._rt = runtime
        self._reconnect = reconnect
        """Makes a fresh runtime to the same server (``RemoteDevice(target, key)``), for a
        watcher whose session a server restart ended; None: no way to connect again."""

    def reconnect(self, window: float) -> str | None:
        """Connect again after the session was lost (a server restart ends every session;
        its jobs resume from their checkpoints): retries for ``window`` seconds. Returns
        None once connected, else why not."""
        if self._reconnect is None:
            return "this device cannot connect again by itself"
        from ._remote_protocol import RemoteError

        deadline = time.monotonic() + window
        why = "no attempt"
        while True:
            try:
                runtime = self._reconnect()
                runtime._call(m.JobList, 0, 1)  # the session is up and answers
            except RemoteError as exc:
                why = str(exc)
                if time.monotonic() > deadline:
                    return why
                time.sleep(RECONNECT_EVERY)
                continue
            self._rt = runtime
            return None

    def _call(self, kind: type, *fields: Any) -> Any:
        try:
            return self._rt._call(kind, *fields)
        except OpFailed as exc:
            raise JobError(str(exc)) from None

    def submit(self, spec: dict[str, Any] | str | Path) -> Job:
        """Queue a job. ``spec``: a dict, TOML text, or the path of a ``.toml`` file; local
        files it names (model.weights, data.path, ...) are uploaded first.

        Raises:
            JobError: the spec was refused; the message starts with the key path.
        """
        base: Path | None = None
        if isinstance(spec, Path) or (isinstance(spec, str) and spec.endswith(".toml")):
            base = Path(spec).parent  # a spec file's local paths are relative to the file
            spec = Path(spec).read_text()
        if isinstance(spec, str):
            try:
                spec = tomllib.loads(spec)
            except tomllib.TOMLDecodeError as exc:
                raise JobError(f"spec: not valid TOML: {exc}") from None
        if not isinstance(spec, dict):
            raise JobError(
                f"spec: expected a dict, TOML text or the path of a .toml file, got "
                f"{type(spec).__name__}"
            )
        doc: dict[str, Any] = json.loads(json.dumps(spec, default=str))  # a deep copy, paths str
        if base is not None:
            _relative_to(doc, base)
        _expand_pretrained(doc)
        local = []
        for section, key in _FILE_KEYS:
            table = doc.get(section)
            value = table.get(key) if isinstance(table, dict) else None
            if isinstance(value, str) and value and not value.startswith(_REF_PREFIXES):
                local.append((section, key, value))
        missing = [f"{s}.{k}: no such file: {v}" for s, k, v in local if not Path(v).is_file()]
        if missing:  # refused before anything is uploaded
            raise JobError(
                "; ".join(missing) + " (a local path is uploaded; name server-side inputs as "
                "sha256:<hex>, server:<path> or job:<id>)"
            )
        for section, key, value in local:
            doc[section][key] = self.upload(value)
        model = doc.get("model")
        files = model.get("base_files") if isinstance(model, dict) else None
        if isinstance(files, dict):
            for name, value in files.items():
                if isinstance(value, str) and not value.startswith(_REF_PREFIXES):
                    files[name] = self.upload(value)
        info = self._call(m.JobSubmit, json.dumps(doc).encode())
        return Job(self, json.loads(info.info))

    def _pipelined(self, calls: Iterable[tuple[Any, ...]]) -> Iterator[Any]:
        try:
            yield from self._rt.call_many(calls, ARTIFACT_WINDOW)
        except OpFailed as exc:
            raise JobError(str(exc)) from None

    def upload(self, path: str | Path) -> str:
        """Store a local file on the server as an artifact; returns ``sha256:<hex>``.
        Chunks are pipelined (ARTIFACT_WINDOW in flight) and read from the file as they
        go, so a large file costs neither a round trip per chunk nor its size in memory."""
        path = Path(path)
        digest = _sha256_of(path)
        total = path.stat().st_size

        def chunks() -> Iterator[tuple[Any, ...]]:
            with open(path, "rb") as f:
                offset = 0
                while True:
                    chunk = f.read(m.ARTIFACT_CHUNK)
                    yield (m.ArtifactPut, digest, offset, total, chunk)
                    offset += len(chunk)
                    if offset >= total:
                        return

        for _ in self._pipelined(chunks()):
            pass
        return f"sha256:{digest.hex()}"

    def download(self, sha: str, dest: str | Path) -> Path:
        """Fetch an artifact in chunks into ``dest`` (written atomically) after checking it.

        Raises:
            ChecksumError: the bytes do not hash to ``sha``; nothing is written.
        """
        digest = bytes.fromhex(sha.removeprefix("sha256:"))
        first = self._call(m.ArtifactGet, digest, 0, m.ARTIFACT_CHUNK)
        total, parts = first.total, [first.data]
        step = m.ARTIFACT_CHUNK
        rest = ((m.ArtifactGet, digest, off, step) for off in range(len(first.data), total, step))
        offset = len(first.data)
        for chunk in self._pipelined(rest):  # ARTIFACT_WINDOW requests in flight
            if chunk.offset != offset or (not chunk.data and offset < total):
                raise JobError(f"artifact {sha[:16]}... ended early at {offset} of {total}")
            parts.append(chunk.data)
            offset += len(chunk.data)
        if offset != total:
            raise JobError(f"artifact {sha[:16]}... ended early at {offset} of {total}")
        data = b"".join(parts)
        actual = hashlib.sha256(data).hexdigest()
        if actual != digest.hex():
            raise ChecksumError(
                f"artifact {digest.hex()[:16]}... failed its checksum: the bytes received hash "
                f"to {actual[:16]}..."
            )
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.part")
        tmp.write_bytes(data)
        os.replace(tmp, dest)
        return dest

    def list(self) -> list[dict[str, Any]]:
        """Every job on the server, oldest first (read page by page)."""
        jobs: list[dict[str, Any]] = []
        after: int | None = 0
        while after is not None:
            page = self.page(after)
            jobs.extend(page["jobs"])
            after = page["next"]
        return jobs

    def page(self, after: int = 0, limit: int = 0) -> dict[str, Any]:
        """One page of jobs with ids above ``after``: ``{"jobs": [...], "next": id}``;
        ``next`` is None on the last page (``limit`` 0: the server's page size)."""
        return json.loads(self._call(m.JobList, after, limit).info)

    def get(self, job_id: int) -> Job:
        """A handle on job ``job_id``, with its current row from the server."""
        return Job(self, json.loads(self._call(m.JobStatus, job_id).info))


class Job:
    """A handle on one server-side job; ``info`` is its last known row."""

    def __init__(self, jobs: Jobs, info: dict[str, Any]) -> None:
        self.jobs, self.info = jobs, info
        self.id: int = info["id"]

    def __repr__(self) -> str:
        return f"Job({self.id}, {self.info['kind']}, {self.info['state']})"

    @property
    def state(self) -> str:
        """The last known state (queued, running, succeeded, failed, cancelled); `status`
        refreshes it."""
        return self.info["state"]

    def status(self) -> dict[str, Any]:
        """The job's row as the server has it now (state, step, loss, ...); also kept as ``info``."""
        self.info = json.loads(self.jobs._call(m.JobStatus, self.id).info)
        return self.info

    def cancel(self) -> dict[str, Any]:
        """Ask the server to cancel; a running job stops at its next step."""
        self.info = json.loads(self.jobs._call(m.JobCancel, self.id).info)
        return self.info

    def events(self, after: int = 0) -> list[dict[str, Any]]:
        """One page of the events numbered above ``after``, oldest first: at most
        JOB_EVENTS_PAGE (1000), fewer where they would pass half the server's frame limit.
        Waits up to a few seconds for the first; [] when none came. Ask again with the last
        ``seq`` for the next page, or use `follow`, which does."""
        return json.loads(self.jobs._call(m.JobWatch, self.id, after).events)

    def follow(
        self, after: int = 0, until_end: bool = True, say: Callable[[str], None] | None = None
    ) -> Iterator[dict[str, Any]]:
        """Every event numbered above ``after``, oldest first, each once, page by page.

        With ``until_end`` it follows the job: new events come as the job stores them, and
        it ends after the job's last one (succeeded, failed or cancelled), riding through a
        server restart as `watch` does (``say`` is told, default stderr). Without it, it
        ends at the events stored so far (after one long poll of a few seconds that brings
        none, or at the last one of a job that has ended).
        """
        seen = after
        while True:
            page = self._page(seen, say or _to_stderr)
            if not page and (not until_end or self.status()["state"] in TERMINAL):
                return  # (an ended job whose last event is at or below ``after``: no more)
            for ev in page:
                seen = ev["seq"]
                yield ev
                if ev["state"] in TERMINAL:
                    return

    def watch(self, progress: bool = True, timeout: float | None = None) -> dict[str, Any]:
        """Follow the job to its end, with a tqdm bar (loss, steps/s) when ``progress``;
        returns the final row. The job's messages (``resumed from the checkpoint at step
        300``) are printed as they come (on stderr). A server restart does not end the
        watch: it connects again for up to BURN_REMOTE_RESUME_TIMEOUT seconds, says so, and
        follows the job as it resumes."""
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=self.info.get("total") or None, desc=f"job {self.id}", unit="step")
        say = (lambda text: bar.write(text, file=sys.stderr)) if bar is not None else _to_stderr
        seen, deadline = 0, None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                for ev in self._page(seen, say):
                    seen = ev["seq"]
                    if ev.get("message"):
                        say(f"job {self.id}: {ev['message']}")
                    if bar is not None and ev.get("step") is not None:
                        bar.n = ev["step"]
                        post = {"state": ev["state"]}
                        if ev.get("loss") is not None:
                            post["loss"] = f"{ev['loss']:.4f}"
                        if ev.get("steps_per_s"):
                            post["steps/s"] = f"{ev['steps_per_s']:.1f}"
                        bar.set_postfix(post, refresh=False)
                        bar.refresh()
                    if ev["state"] in TERMINAL:
                        return self.status()
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"job {self.id} still {self.status()['state']}")
        finally:
            if bar is not None:
                bar.close()

    def _page(self, after: int, say: Callable[[str], None]) -> list[dict[str, Any]]:
        """`events(after)`, connecting again (for up to BURN_REMOTE_RESUME_TIMEOUT seconds,
        saying so) when the server was lost: a restart does not end a watch."""
        from ._remote_link import RESUME_TIMEOUT
        from ._remote_protocol import RemoteError

        while True:
            try:
                return self.events(after)
            except RemoteError:
                say(f"job {self.id}: lost the server (restarting?); connecting again for "
                    f"up to {RESUME_TIMEOUT:g} s")  # fmt: skip
                why = self.jobs.reconnect(RESUME_TIMEOUT)
                if why is not None:
                    raise RemoteError(
                        f"job {self.id}: the server did not come back within "
                        f"{RESUME_TIMEOUT:g} s (BURN_REMOTE_RESUME_TIMEOUT): {why}; the "
                        f"job itself may still run: `burn-remote jobs watch {self.id}`"
                    ) from None
                say(f"job {self.id}: connected again; following it as it resumes")

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """Block until the job ends; raises JobError if it failed."""
        info = self.watch(progress=False, timeout=timeout)
        if info["state"] == "failed":
            raise JobError(f"job {self.id} failed: {info['error']}")
        return info

    def fetch(self, directory: str | Path) -> dict[str, Path]:
        """Download the outputs (checksums verified) into ``directory``; name -> path.

        Raises:
            JobError: the server named an output that is not a plain file name (a path
                separator, ``..``, an absolute path); nothing is written then.
        """
        info = self.status()
        if info["state"] != "succeeded":
            raise JobError(f"job {self.id} is {info['state']}; only succeeded jobs have outputs")
        outputs = info["outputs"]
        if not isinstance(outputs, dict):
            raise JobError(f"job {self.id}: the server sent outputs that are not a mapping")
        dest = Path(directory)
        paths = {name: output_path(dest, name) for name in outputs}  # all checked first
        return {name: self.jobs.download(sha, paths[name]) for name, sha in outputs.items()}


MAX_OUTPUT_NAME = 255
"""Longest output file name accepted from a server (a common file-system limit)."""


def _refused_output(name: object, bad: str) -> JobError:
    return JobError(f"the server named a job output {name!r}, which {bad}; nothing written")


def output_path(directory: Path, name: object) -> Path:
    """``directory / name`` for an output name a server sent, after checking that the name is
    one plain file name: a malicious or compromised server must not write elsewhere.

    Raises:
        JobError: naming what is wrong with the name.
    """
    if not isinstance(name, str) or not name:
        raise _refused_output(name, "is not a non-empty string")
    bad = None
    if len(name) > MAX_OUTPUT_NAME:
        bad = f"is longer than {MAX_OUTPUT_NAME} characters"
    elif name in (".", ".."):
        bad = "is a directory reference"
    elif "/" in name or "\\" in name or os.sep in name or (os.altsep and os.altsep in name):
        bad = "contains a path separator"
    elif "\0" in name or any(ord(c) < 32 for c in name):
        bad = "contains a control character"
    elif Path(name).is_absolute() or Path(name).drive:
        bad = "is an absolute path"
    if bad is not None:
        raise _refused_output(name, bad)
    path = directory / name
    if path.resolve().parent != directory.resolve():  # belt and braces (symlinked names)
        raise JobError(f"the job output {name!r} would be written outside {directory}")
    return path


__all__ = ["ChecksumError", "Job", "JobError", "Jobs", "output_path"]
