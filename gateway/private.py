"""Keeping the data dir private: the umask the daemon runs under, and the start-up check that
warns when an existing data dir or file can be read by other local users.

Transcripts hold private conversations, and the SQLite files (``memory.db``, ``sessions.db``
and their ``-wal``/``-shm`` companions) hold the same text, so every file the daemon creates
must be 0600 and every directory 0700. SQLite creates the WAL and SHM itself, with the mode of
the database file, so a process-wide umask of 077 set before anything is opened is the one
place that covers them all; the modules that create files also pass 0600/0700 explicitly, so
they stay private when used as a library without that umask.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DIR_MODE", "PRIVATE_UMASK", "Exposure", "find_exposed", "make_private_dir", "set_private_umask"]

PRIVATE_UMASK = 0o077
DIR_MODE = 0o700
# Read or write for group or others: either lets another local user at the text.
_EXPOSED_BITS = stat.S_IRGRP | stat.S_IWGRP | stat.S_IROTH | stat.S_IWOTH
# The warning names this many paths; the count says how many there are in all.
_NAMED = 5


def set_private_umask() -> int:
    """Make every file and directory this process creates private; returns the old umask."""
    return os.umask(PRIVATE_UMASK)


def make_private_dir(path: Path) -> None:
    """``path`` (and missing parents) created 0700; an existing directory is left as it is
    (:func:`find_exposed` reports it instead: changing a mode the owner chose is theirs to do)."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)


@dataclass(frozen=True, slots=True)
class Exposure:
    """Paths under the data dir that other local users can read or write."""

    paths: tuple[str, ...]  # the first few, for the warning
    count: int

    def hint(self, data_dir: Path) -> str:
        return f"chmod -R go-rwx {data_dir}"


def find_exposed(data_dir: Path) -> Exposure:
    """Every entry of ``data_dir`` (itself included) with group/other read or write bits.

    Symlinks are not followed: the daemon never creates them, and their target's mode is not
    the data dir's business. A missing data dir exposes nothing.
    """
    named: list[str] = []
    count = 0

    def check(path: str, st: os.stat_result) -> None:
        nonlocal count
        if st.st_mode & _EXPOSED_BITS and not stat.S_ISLNK(st.st_mode):
            count += 1
            if len(named) < _NAMED:
                named.append(f"{path} ({stat.filemode(st.st_mode)})")

    try:
        check(str(data_dir), os.lstat(data_dir))
    except FileNotFoundError:
        return Exposure((), 0)
    for root, dirs, files in os.walk(data_dir):
        for name in [*dirs, *files]:
            path = os.path.join(root, name)
            try:
                check(path, os.lstat(path))
            except FileNotFoundError:
                continue  # removed while we looked
    return Exposure(tuple(named), count)
