"""Room on disk for what a peer asks the server to keep: checked before anything is written.

Two bounds besides each peer's own (``--peer-disk``): the data directory as a whole
(``--disk-limit``, off by default) and a reserve of free space on its filesystem that new
uploads and new jobs never take (DISK_RESERVE_SHARE of the filesystem, at most
DISK_RESERVE_MAX). The reserve is what lets jobs already accepted write their checkpoints,
outputs and events, and the job store its journal, when peers have filled the rest: a peer
filling the disk gets a clear refusal, and what was accepted before, its own or another
peer's, is never lost for want of space.
"""

from __future__ import annotations

import os
from pathlib import Path

DISK_RESERVE_SHARE = 0.05
"""Share of the data directory's filesystem that uploads and new jobs leave free."""
DISK_RESERVE_MAX = 2**30
"""The reserve is at most this many bytes (5% of a large disk is more than jobs need)."""


class NoRoom(Exception):
    """Not written: the message says which bound and what to do."""


def reserve(root: Path) -> int:
    """Bytes of the filesystem holding ``root`` that uploads and new jobs leave free."""
    st = os.statvfs(root)
    return min(DISK_RESERVE_MAX, int(st.f_blocks * st.f_frsize * DISK_RESERVE_SHARE))


def free(root: Path) -> int:
    """Bytes an unprivileged writer can still use on the filesystem holding ``root``."""
    st = os.statvfs(root)
    return st.f_bavail * st.f_frsize


def used(root: Path) -> int:
    """Bytes of files under the data directory (artifacts, uploads, checkpoints, job work
    folders, the job store and its journal)."""
    total = 0
    for folder, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                continue  # removed while we walked
    return total


def check_room(root: Path, nbytes: int, disk_limit: int, what: str) -> None:
    """Raise NoRoom unless ``nbytes`` more fit under ``disk_limit`` (0: no such limit) and
    above the filesystem's reserve."""
    if disk_limit:
        have = used(root)
        if have + nbytes > disk_limit:
            raise NoRoom(
                f"{what} refused: the server's data directory holds {have} bytes and its "
                f"limit is {disk_limit} (--disk-limit); nothing was stored"
            )
    left, keep = free(root), reserve(root)
    if left - nbytes < keep:
        raise NoRoom(
            f"{what} refused: the server's disk is nearly full ({left} bytes free, "
            f"{keep} kept in reserve for jobs already accepted); nothing was stored"
        )


__all__ = ["DISK_RESERVE_MAX", "DISK_RESERVE_SHARE", "NoRoom", "check_room", "reserve", "used"]
