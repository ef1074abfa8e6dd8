"""The README's code blocks, read as steps a test can run as written.

A section's blocks come out in order with their language. Shell blocks are split into
commands (backslash continuations joined) and each command carries the host it runs on: a
comment line ``# on HOST...`` switches host for the lines after it, and a trailing
``# prints NAME`` names the placeholder the command's output stands for in later blocks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
HOST = re.compile(r"^# on (?:the )?([\w-]+)")
PRINTS = re.compile(r"#\s*prints (\w+)\s*$")


@dataclass(frozen=True)
class Command:
    host: str
    line: str
    """The command as written, without its trailing comment."""
    prints: str | None
    """The placeholder its stdout stands for (``SERVER_ID``), if the README names one."""


def section(heading: str) -> str:
    """The README text under ``## heading`` up to the next ``## `` heading."""
    text = README.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def blocks(heading: str) -> list[tuple[str, str]]:
    """``(language, body)`` of every fenced block of a section, in order."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(section(heading))]


def commands(body: str, host: str = "local") -> list[Command]:
    """A shell block's commands; the host switches at each ``# on HOST`` comment line."""
    out: list[Command] = []
    pending = ""
    for raw in body.splitlines():
        line = raw.rstrip()
        if not pending and line.lstrip().startswith("#"):
            m = HOST.match(line.strip())
            if m:
                host = m.group(1)
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        if not full.strip():
            continue
        m = PRINTS.search(full)
        command = re.sub(r"\s+#.*$", "", full) if " #" in full else full
        out.append(Command(host, command.strip(), m.group(1) if m else None))
    return out
