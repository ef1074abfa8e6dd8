"""``burn-remote jobs submit|list|status|watch|cancel|fetch --peer PEER@HOST:PORT``.

Thin functions over the client's ``dev.jobs`` API; each prints JSON (or a progress bar for
``watch``) and returns the exit status: 0 done, 1 refused or failed, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def _jobs(args: argparse.Namespace) -> Any:
    from burn_remote import RemoteDevice

    return RemoteDevice(args.peer, key=args.key).jobs


def _print(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True))


def cmd_jobs(args: argparse.Namespace) -> int:
    """Dispatch one jobs action; server refusals print their message and give status 1."""
    from burn_remote import JobError, RemoteError

    try:
        jobs = _jobs(args)
        if args.action == "submit":
            job = jobs.submit(args.spec)
            _print(job.info)
            if args.watch:
                return 0 if job.watch()["state"] == "succeeded" else 1
        elif args.action == "list":
            for j in jobs.list():
                step = f"{j['step']}/{j['total']}"
                print(f"{j['id']:>5}  {j['kind']:<14} {j['state']:<10} {step:>11}  {j['device']}")
        elif args.action == "status":
            _print(jobs.get(args.job).status())
        elif args.action == "watch":
            info = jobs.get(args.job).watch()
            _print(info)
            return 0 if info["state"] == "succeeded" else 1
        elif args.action == "cancel":
            _print(jobs.get(args.job).cancel())
        elif args.action == "fetch":
            for name, path in jobs.get(args.job).fetch(args.dir).items():
                print(f"{name}: {path}")
        return 0
    except (JobError, RemoteError, OSError, ValueError) as exc:
        print(f"burn-remote jobs {args.action}: {exc}", file=sys.stderr)
        return 1


def add_jobs(sub: argparse._SubParsersAction) -> None:
    """Register ``jobs`` and its actions (no heavy imports here: ``--help`` stays instant)."""
    p = sub.add_parser(
        "jobs",
        help="submit and follow long-running jobs on a server",
        description="Jobs run on the server (which needs --data-dir) and survive restarts.",
    )
    acts = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    def action(name: str, help: str) -> argparse.ArgumentParser:
        a = acts.add_parser(name, help=help)
        a.add_argument("--peer", required=True, metavar="PEER@HOST:PORT", help="the server")
        a.add_argument("--key", metavar="FILE", help="this client's key file")
        a.set_defaults(func=cmd_jobs)
        return a

    a = action("submit", "submit a spec (TOML file); local files it names are uploaded")
    a.add_argument("spec", help="path of the TOML spec")
    a.add_argument("--watch", action="store_true", help="then follow it with a progress bar")
    action("list", "list the server's jobs")
    for name, text in (
        ("status", "print a job's row"),
        ("watch", "follow a job with a progress bar until it ends"),
        ("cancel", "cancel a job (a running one keeps its last checkpoint)"),
    ):
        action(name, text).add_argument("job", type=int)
    a = action("fetch", "download a job's outputs, checksums verified")
    a.add_argument("job", type=int)
    a.add_argument("dir", help="destination directory")


__all__ = ["add_jobs", "cmd_jobs"]
