"""``burn-remote jobs submit|list|status|watch|cancel|fetch --peer PEER``.

Thin functions over the client's ``dev.jobs`` API. Each prints a human form, or JSON with
``--json``, and returns the exit status: 0 done, 1 refused or failed (the reason on stderr),
2 bad arguments (a spec file that is not there, say).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def _jobs(args: argparse.Namespace) -> Any:
    from burn_remote import RemoteDevice

    return RemoteDevice(args.peer, key=args.key).jobs


def _json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True))


TABLE = ("ID", "NAME", "KIND", "STATE", "STEP", "AGE")
"""`jobs list`'s columns; `--json` gives every field."""


def _age(since: float | None, now: float | None = None) -> str:
    """Seconds since ``since`` as a person reads them: 45s, 12m, 3h, 2d."""
    if not since:
        return "-"
    s = max(0.0, (now or time.time()) - since)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{int(s // size)}{unit}"
    return f"{int(s)}s"


def _name(j: dict[str, Any]) -> str:
    spec = j.get("spec")
    return (spec.get("name") if isinstance(spec, dict) else None) or "-"


def _table(rows: list[dict[str, Any]]) -> str:
    """Jobs as an aligned table with a header line."""
    cells = [TABLE] + [
        (str(j["id"]), _name(j), j["kind"], j["state"], f"{j['step']}/{j['total']}",
         _age(j.get("created")))
        for j in rows
    ]  # fmt: skip
    widths = [max(len(r[i]) for r in cells) for i in range(len(TABLE))]
    right = {0, 4, 5}
    return "\n".join(
        "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in
                  enumerate(zip(r, widths))).rstrip()
        for r in cells
    )  # fmt: skip


def _describe(j: dict[str, Any]) -> str:
    """A job in a few lines for a person: what, where it stands, what came of it (the whole
    record, spec included, is ``--json``)."""
    named = f" ({_name(j)})" if _name(j) != "-" else ""
    lines = [f"job {j['id']}{named}: {j['kind']} on {j['device']}"]
    lines.append(f"state: {j['state']}")
    lines.append(f"step: {j['step']}/{j['total']}")
    lines.append(f"created: {_age(j.get('created'))} ago")
    if j.get("finished"):
        lines.append(f"finished: {_age(j['finished'])} ago")
    elif j.get("started"):
        lines.append(f"started: {_age(j['started'])} ago")
    if j.get("checkpoint_step"):
        lines.append(f"checkpoint: step {j['checkpoint_step']}")
    if j.get("error"):
        lines.append(f"error: {j['error']}")
    if j.get("outputs"):
        lines.append(f"outputs: {', '.join(sorted(j['outputs']))} (`jobs fetch {j['id']} DIR`)")
    return "\n".join(lines)


def _event_line(ev: dict[str, Any]) -> str:
    """One event for a person: when, the state, then what it says."""
    when = time.strftime("%H:%M:%S", time.localtime(ev.get("time", 0)))
    parts = [f"{ev['seq']:>5}", when, f"{ev.get('state', ''):<9}"]
    if ev.get("step") is not None:
        parts.append(f"step {ev['step']}/{ev.get('total', '?')}")
    if ev.get("loss") is not None:
        parts.append(f"loss {ev['loss']:.4f}")
    if ev.get("checkpoint"):
        parts.append(f"checkpoint at step {ev['checkpoint']}")
    if ev.get("message"):
        parts.append(str(ev["message"]))
    if ev.get("error"):
        parts.append(str(ev["error"]))
    return "  ".join(parts)


def _show(args: argparse.Namespace, info: dict[str, Any]) -> None:
    _json(info) if args.json else print(_describe(info))


def _ended(args: argparse.Namespace, info: dict[str, Any]) -> int:
    """The exit status of a job that ended; a failure's reason goes to stderr."""
    if info["state"] == "succeeded":
        return 0
    why = f"failed: {info.get('error')}" if info["state"] == "failed" else info["state"]
    print(f"burn-remote jobs {args.action}: job {info['id']} {why}", file=sys.stderr)
    return 1


def cmd_jobs(args: argparse.Namespace) -> int:
    """Dispatch one jobs action; server refusals print their message and give status 1."""
    from burn_remote import JobError, RemoteError

    if args.action == "submit" and not Path(args.spec).is_file():
        print(f"burn-remote jobs submit: no such spec file: {args.spec}", file=sys.stderr)
        return 2
    try:
        return _ACTIONS[args.action](args, _jobs(args))
    except (JobError, RemoteError, OSError, ValueError, TimeoutError) as exc:
        print(f"burn-remote jobs {args.action}: {exc}", file=sys.stderr)
        return 1


def _submit(args: argparse.Namespace, jobs: Any) -> int:
    job = jobs.submit(Path(args.spec))
    if not args.watch:
        if args.json:
            _json(job.info)
        else:
            named = f" ({_name(job.info)})" if _name(job.info) != "-" else ""
            print(f"job {job.id}{named} {job.info['state']}: {job.info['kind']}, "
                  f"{job.info['total']} steps on {job.info['device']}")  # fmt: skip
            print(f"follow it: burn-remote jobs watch {job.id} --peer {args.peer}")
        return 0
    if not args.json:
        print(f"job {job.id} queued ({job.info['kind']})")
    info = job.watch(progress=not args.json)
    _show(args, info)
    return _ended(args, info)


def _list(args: argparse.Namespace, jobs: Any) -> int:
    rows = jobs.list()
    if args.json:
        _json(rows)
    elif rows:
        print(_table(rows))
    else:
        print("no jobs")
    return 0


def _seq(text: str) -> int:
    """An event number for ``--after``: an integer, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not an event number (0 or more)")
    return value


def _events(args: argparse.Namespace, jobs: Any) -> int:
    """Every stored event of a job above ``--after`` (state changes, progress, checkpoints,
    messages such as "resumed from the checkpoint at step 300"), oldest first, each once,
    printed page by page as they arrive. ``--follow`` goes on until the job ends; ``--json``
    prints one array, or with ``--follow`` one JSON object a line."""
    job = jobs.get(args.job)
    job.status()  # an unknown job is refused here, before any wait
    events = job.follow(args.after, until_end=args.follow)
    if args.json and not args.follow:
        _json(list(events))
        return 0
    for ev in events:
        print(json.dumps(ev) if args.json else _event_line(ev), flush=True)
    return 0


def _status(args: argparse.Namespace, jobs: Any) -> int:
    _show(args, jobs.get(args.job).status())
    return 0


def _watch(args: argparse.Namespace, jobs: Any) -> int:
    info = jobs.get(args.job).watch(progress=not args.json)
    _show(args, info)
    return _ended(args, info)


def _cancel(args: argparse.Namespace, jobs: Any) -> int:
    """Ask for the cancel and return: a queued job is cancelled at once, a running one stops
    at its next step (keeping its last checkpoint). ``--wait`` blocks until it has."""
    job = jobs.get(args.job)
    info = job.cancel()
    if args.wait and info["state"] in ("queued", "running"):
        info = job.watch(progress=False)
    if args.json:
        _json(info)
    elif info["state"] in ("queued", "running"):
        print(f"job {job.id}: cancel requested; it stops at its next step "
              f"(`jobs cancel {job.id} --wait` waits for it)")  # fmt: skip
    else:
        kept = f"; its checkpoint at step {info['checkpoint_step']} is kept"
        print(f"job {job.id}: {info['state']}{kept if info.get('checkpoint_step') else ''}")
    return 0


def _fetch(args: argparse.Namespace, jobs: Any) -> int:
    files = jobs.get(args.job).fetch(args.dir)
    if args.json:
        _json({name: str(path) for name, path in files.items()})
    else:
        for name, path in files.items():
            print(f"{name}: {path}")
    return 0


_ACTIONS = {
    "submit": _submit,
    "list": _list,
    "status": _status,
    "watch": _watch,
    "events": _events,
    "cancel": _cancel,
    "fetch": _fetch,
}


def cmd_template(args: argparse.Namespace) -> int:
    """Print the annotated spec of a job kind (docs/jobs.md shows the same)."""
    from ._templates import TEMPLATES

    if args.kind not in TEMPLATES:
        print(
            f"burn-remote jobs template: no kind {args.kind!r}; kinds: {', '.join(TEMPLATES)}",
            file=sys.stderr,
        )
        return 2
    print(TEMPLATES[args.kind], end="")
    return 0


def add_jobs(sub: argparse._SubParsersAction, target_help: str) -> None:
    """Register ``jobs`` and its actions (no heavy imports here: ``--help`` stays instant).

    ``target_help`` is the CLI's one wording of a server address, passed down so this module
    does not import the CLI that imports it."""
    p = sub.add_parser(
        "jobs",
        help="submit and follow long-running jobs on a server",
        description="Jobs run on the server (which needs --data-dir) and survive restarts.",
    )
    acts = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    def action(name: str, help: str) -> argparse.ArgumentParser:
        a = acts.add_parser(name, help=help, description=help)
        a.add_argument("--peer", required=True, metavar="PEER", help=target_help)
        a.add_argument("--key", metavar="FILE", help="this client's key file")
        a.add_argument("--json", action="store_true", help="print JSON instead of text")
        a.set_defaults(func=cmd_jobs)
        return a

    a = action("submit", "submit a spec (TOML file); local files it names are uploaded")
    a.add_argument("spec", help="path of the TOML spec")
    a.add_argument(
        "--watch",
        action="store_true",
        help="then follow it with a progress bar; exit 1 with the reason if it fails",
    )
    action("list", "a table of the server's jobs (yours; an admin's: all): id, name, kind, "
           "state, step, age")  # fmt: skip
    for name, text in (
        ("status", "print where a job stands (--json: the whole record, spec included)"),
        ("watch", "follow a job with a progress bar until it ends; exit 1 if it failed"),
    ):
        action(name, text).add_argument("job", type=int)
    a = action("events", "print a job's events, oldest first: state changes, progress, "
               "checkpoints, messages")  # fmt: skip
    a.add_argument("job", type=int)
    a.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="keep printing new events as the job stores them, until it ends (rides "
        "through a server restart); with --json, one JSON object a line",
    )
    a.add_argument(
        "--after",
        type=_seq,
        default=0,
        metavar="SEQ",
        help="only the events numbered above SEQ (the first column): to carry on from the "
        "last one seen",
    )
    a = action("cancel", "cancel a job and print the state it ends in (a running one keeps "
               "its last checkpoint)")  # fmt: skip
    a.add_argument("job", type=int)
    a.add_argument(
        "--wait", action="store_true", help="block until the job has stopped, then print its state"
    )
    a.add_argument("--no-wait", action="store_true", help=argparse.SUPPRESS)  # the old default
    a = action("fetch", "download a job's outputs, checksums verified")
    a.add_argument("job", type=int)
    a.add_argument("dir", help="destination directory")
    t = acts.add_parser(
        "template",
        help="print an annotated spec of a job kind, to edit and submit",
        description="Print an annotated TOML spec of a job kind (lora_finetune, train, "
        "onnx_export): `burn-remote jobs template lora_finetune > lora.toml`. Every key is "
        "described in docs/jobs.md.",
    )
    t.add_argument("kind", help="lora_finetune, train or onnx_export")
    t.set_defaults(func=cmd_template)


__all__ = ["add_jobs", "cmd_jobs"]
