"""The tables of protocol/README.md, read as data: what the conformance suite builds frames
from (it imports nothing of the client), and what test_spec_tables checks against the code."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "protocol" / "README.md"


@dataclass(frozen=True)
class MessageSpec:
    tag: int
    name: str
    fields: tuple[tuple[str, str], ...]
    """(name, wire type) in wire order."""


def _section(title: str) -> str:
    text = README.read_text()
    start = text.index(title)
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def _rows(section: str) -> list[list[str]]:
    return [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in section.splitlines()
        if re.match(r"\|\s*\d+\s*\|", line)
    ]


def messages() -> dict[str, MessageSpec]:
    """Message name -> its tag and fields, from the table of section 4."""
    out = {}
    for tag, name, fields, *_ in _rows(_section("## 4. Messages")):
        parsed = tuple(tuple(f.split()) for f in fields.split(",") if f.strip())
        out[name] = MessageSpec(int(tag), name, parsed)  # type: ignore[arg-type]
    return out


def errors() -> dict[str, int]:
    """Error name -> code, from the table of section 6."""
    return {name: int(code) for code, name, *_ in _rows(_section("## 6. Errors"))}


def worked_example() -> tuple[bytes, str]:
    """The graph bytes and digest of the worked example in section 5."""
    text = _section("## 5. Graphs")
    hexes = re.search(r"bytes are `([0-9a-f \n]+)`", text)
    digest = re.search(r"sha256 is\s+`([0-9a-f]{64})`", text)
    assert hexes and digest
    return bytes.fromhex(hexes.group(1).replace("\n", " ")), digest.group(1)
