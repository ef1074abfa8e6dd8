"""The daemon's logs: one line per event on stderr, as text or JSON, with UTC timestamps.

Every record may carry an ``event`` name (``session_opened``, ``job_failed``...) and fields
(``session``, ``peer``, ``job``, ``error``...) passed as ``extra``; both formats show them,
so an operator can grep text logs and a log shipper can index JSON ones. The banner that
``serve`` prints on stdout (peer id, addresses) is not a log: scripts read it.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
FIELDS = (
    "event",
    "session",
    "peer",
    "address",
    "job",
    "kind",
    "state",
    "error",
    "retry_s",
    "seconds",
)
"""``extra`` keys shown (in this order), besides the message."""

_STANDARD = set(vars(logging.makeLogRecord({})))


def _timestamp(record: logging.LogRecord) -> str:
    t = time.gmtime(record.created)
    return time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{int(record.msecs):03d}Z"


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    extra = {k: v for k, v in vars(record).items() if k not in _STANDARD}
    ordered = {k: extra.pop(k) for k in FIELDS if k in extra}
    ordered.update(extra)
    return ordered


class TextFormatter(logging.Formatter):
    """``2026-11-30T11:10:45.123Z INFO  server: session 3 opened  event=session_opened ...``"""

    def format(self, record: logging.LogRecord) -> str:
        name = record.name.removeprefix("burn_remote.")
        line = f"{_timestamp(record)} {record.levelname:<7} {name}: {record.getMessage()}"
        fields = _fields(record)
        if fields:
            line += "  " + " ".join(f"{k}={_show(v)}" for k, v in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``msg``, then the fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(_fields(record))
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def _show(v: Any) -> str:
    text = str(v)
    return json.dumps(text) if (not text or " " in text or '"' in text) else text


LIBRARY_LEVEL = logging.WARNING
"""Least level shown from other libraries' loggers (aioquic's ``quic``, trio...): their
warnings and errors, in this format; their info and debug chatter is per packet."""


def configure(level: str = "info", fmt: str = "text", stream: TextIO | None = None) -> None:
    """Route every logger to ``stream`` (stderr) in ``fmt``: ``burn_remote``'s at ``level``,
    other libraries' (aioquic's among them) at LIBRARY_LEVEL or ``level`` if higher, through
    the one handler on the root logger, so that with ``--log-format json`` every line on
    stderr is JSON (Python's last-resort handler would print a library's warning raw)."""
    if level not in LEVELS:
        raise ValueError(f"log level {level!r}: expected one of {', '.join(LEVELS)}")
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: expected one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(max(LIBRARY_LEVEL, logging.getLevelName(level.upper())))
    ours = logging.getLogger("burn_remote")
    for old in list(ours.handlers):  # an earlier configure() of this process
        ours.removeHandler(old)
    ours.setLevel(level.upper())
    ours.propagate = True


__all__ = ["FORMATS", "LEVELS", "JsonFormatter", "TextFormatter", "configure"]
