"""Print what the compose image installs, one requirement a line, from pyproject.toml: the
project's dependencies, its ``multinode`` extra (the test runner's needs) and its build
requirements. The host's wheelhouse and the image's install read the same list.

Usage: python deploy/compose/requirements.py [PYPROJECT]
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path


def requirements(pyproject: Path) -> list[str]:
    doc = tomllib.loads(pyproject.read_text())
    project = doc["project"]
    return [
        *project["dependencies"],
        *project["optional-dependencies"]["multinode"],
        *doc["build-system"]["requires"],
    ]


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("pyproject.toml")
    print("\n".join(requirements(path)))
