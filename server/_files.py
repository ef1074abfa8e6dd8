"""The data directory is the server's alone: its keys, job store, artifacts, uploads and
checkpoints are readable and writable by the server's user only.

At start the directory is created 0700, or an existing one (and everything in it) is
tightened to 0700 for directories and 0600 for files; the process umask is set to 077 so
every file written later is created private too. A data directory owned by another user
is refused (the server could not tighten it, and that user could read everything).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


class DataDirError(Exception):
    """The data directory cannot be made private; the message says why, in one line."""


def make_private(path: str | os.PathLike[str]) -> list[Path]:
    """Create or tighten ``path`` as above; returns the entries whose mode was changed."""
    os.umask(0o077)
    root = Path(path)
    try:
        root.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
        st = root.lstat()
    except OSError as exc:
        raise DataDirError(f"data dir {root}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise DataDirError(f"data dir {root}: not a directory")
    if st.st_uid != os.geteuid():
        raise DataDirError(
            f"data dir {root} belongs to uid {st.st_uid}, not to this server's user "
            f"(uid {os.geteuid()}); it must be the server's alone"
        )
    changed: list[Path] = []
    try:
        _tighten(root, PRIVATE_DIR, changed)
        for folder, dirs, files in os.walk(root):
            for name in dirs:
                _tighten(Path(folder) / name, PRIVATE_DIR, changed)
            for name in files:
                _tighten(Path(folder) / name, PRIVATE_FILE, changed)
    except OSError as exc:
        raise DataDirError(f"data dir {root}: cannot make it private: {exc}") from None
    return changed


def _tighten(path: Path, mode: int, changed: list[Path]) -> None:
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        return  # a link's own mode means nothing; its target is checked where it lives
    if stat.S_IMODE(st.st_mode) & ~mode:
        os.chmod(path, stat.S_IMODE(st.st_mode) & mode)
        changed.append(path)


__all__ = ["DataDirError", "make_private"]
