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

CANCEL_WAIT = 30.0
"""Seconds ``jobs cancel`` waits for a running job to stop at its next step."""


def _jobs(args: argparse.Namespace) -> Any:
    from burn_remote import RemoteDevice

    return RemoteDevice(args.peer, key=args.key).jobs


def _json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True))


def _row(j: dict[str, Any]) -> str:
    step = f"{j['step']}/{j['total']}"
    return f"{j['id']:>5}  {j['kind']:<14} {j['state']:<10} {step:>11}  {j['device']}"


def _describe(j: dict[str, Any]) -> str:
    """A job's row as ``key: value`` lines (specs and outputs as JSON)."""
    lines = []
    for key in sorted(j):
        value = j[key]
        if isinstance(value, dict | list):
            value = json.dumps(value, sort_keys=True)
        lines.append(f"{key}: {value}")
    return "\n".join(lines)


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
        _show(args, job.info)
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
    else:
        for j in rows:
            print(_row(j))
    return 0


def _status(args: argparse.Namespace, jobs: Any) -> int:
    _show(args, jobs.get(args.job).status())
    return 0


def _watch(args: argparse.Namespace, jobs: Any) -> int:
    info = jobs.get(args.job).watch(progress=not args.json)
    _show(args, info)
    return _ended(args, info)


def _cancel(args: argparse.Namespace, jobs: Any) -> int:
    """Cancel, then wait for the job to stop (a running one stops at its next step) and show
    the state it is in now, not the one it had."""
    job = jobs.get(args.job)
    seen = max((e["seq"] for e in job.events(0)), default=0)
    info = job.cancel()
    deadline = time.monotonic() + CANCEL_WAIT
    while info["state"] in ("queued", "running") and not args.no_wait:
        if time.monotonic() > deadline:
            print(
                f"burn-remote jobs cancel: job {job.id} is still {info['state']} after "
                f"{CANCEL_WAIT:.0f} s; it stops at its next step",
                file=sys.stderr,
            )
            break
        seen = max((e["seq"] for e in job.events(seen)), default=seen)  # a long poll
        info = job.status()
    if args.json:
        _json(info)
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
    action("list", "list the server's jobs (yours; an admin's: all)")
    for name, text in (
        ("status", "print a job's row"),
        ("watch", "follow a job with a progress bar until it ends; exit 1 if it failed"),
    ):
        action(name, text).add_argument("job", type=int)
    a = action("cancel", "cancel a job and print the state it ends in (a running one keeps "
               "its last checkpoint)")  # fmt: skip
    a.add_argument("job", type=int)
    a.add_argument(
        "--no-wait", action="store_true", help="return at once instead of waiting for the stop"
    )
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
