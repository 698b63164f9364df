"""Keeping the data dir private: the umask the daemon runs under, the data dir tightened to 0700
at start (or the start refused when it cannot be), and the start-up check that warns when an
existing file can be read by other local users.

Transcripts hold private conversations, and the SQLite files (``memory.db``, ``sessions.db``
and their ``-wal``/``-shm`` companions) hold the same text, so every file the daemon creates
must be 0600 and every directory 0700. SQLite creates the WAL and SHM itself, with the mode of
the database file, so a process-wide umask of 077 set before anything is opened is the one
place that covers them all; the modules that create files also pass 0600/0700 explicitly, so
they stay private when used as a library without that umask.

The audit lstats every file, which at 82k transcripts took most of a second of each start. So a
daemon that stops cleanly after an audit that found nothing leaves ``modes.clean``: the mtime
of every directory under the data dir. The next start takes it away and lstats only those
directories and the entries of any whose mtime changed (something was created, renamed or
removed in it while the daemon was down); the files it created itself in between are private
by the umask. A mode changed with ``chmod`` on a file that already existed changes no
directory, so it is reported at the next full audit: after a crash, or after a start that found
something exposed. Without the marker (a crash) the audit walks every file.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

__all__ = [
    "DIR_MODE",
    "DataDirExposed",
    "MARKER_NAME",
    "PRIVATE_UMASK",
    "DirMarks",
    "Exposure",
    "find_exposed",
    "make_private_dir",
    "mark_clean_stop",
    "set_private_umask",
    "take_clean_stop",
    "tighten_private_dir",
]

PRIVATE_UMASK = 0o077
DIR_MODE = 0o700
# Read or write for group or others: either lets another local user at the text.
_EXPOSED_BITS = stat.S_IRGRP | stat.S_IWGRP | stat.S_IROTH | stat.S_IWOTH
# Any access at all for group or others, traversal included: what the data dir itself loses.
_GROUP_OTHER_BITS = 0o077
# The warning names this many paths; the count says how many there are in all.
_NAMED = 5
MARKER_NAME = "modes.clean"
_MARKER_VERSION = 1
# FAT has 2 s mtimes, some network file systems 1 s: a change this close to the marker may hide.
_COARSE_NS = 2_000_000_000


def set_private_umask() -> int:
    """Make every file and directory this process creates private; returns the old umask."""
    return os.umask(PRIVATE_UMASK)


class DataDirExposed(OSError):
    """The data dir has group or world access and cannot be tightened: the daemon refuses to
    start (PostgreSQL refuses a data directory with group or world access the same way)."""


def make_private_dir(path: Path) -> int | None:
    """``path`` (and missing parents) created 0700; for an existing one with group or world
    access, its mode, which :func:`tighten_private_dir` then makes owner-only (None: nothing
    to tighten). Checked before the daemon writes anything into it.

    :class:`DataDirExposed`, naming the ``chmod`` that fixes it, when such a directory cannot
    be tightened because another user owns it (changing someone else's modes is theirs to do,
    even for root).
    """
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    st = os.stat(path)
    mode = stat.S_IMODE(st.st_mode)
    if not mode & _GROUP_OTHER_BITS:
        return None
    if st.st_uid != os.geteuid():
        raise DataDirExposed(f"{_exposed(path, mode)} and is owned by uid {st.st_uid}, not this "
                             f"user (uid {os.geteuid()}), so it cannot be tightened; run `chmod "
                             f"0700 {path}` as its owner, or point --data-dir at a "
                             "directory of your own")
    return mode


def tighten_private_dir(path: Path, mode: int) -> None:
    """Drop every group and world bit of ``mode`` (what :func:`make_private_dir` found) from
    ``path``; DataDirExposed naming the fix when ``chmod`` fails."""
    try:
        os.chmod(path, mode & ~_GROUP_OTHER_BITS)
    except OSError as err:
        raise DataDirExposed(f"{_exposed(path, mode)} and could not be tightened ({err.strerror}); "
                             f"run `chmod 0700 {path}`") from err


def _exposed(path: Path, mode: int) -> str:
    return f"data directory {path} has group or world access ({mode:04o})"


@dataclass(frozen=True, slots=True)
class Exposure:
    """Paths under the data dir that other local users can read or write."""

    paths: tuple[str, ...]  # the first few, for the warning
    count: int

    def hint(self, data_dir: Path) -> str:
        return f"chmod -R go-rwx {data_dir}"


@dataclass(frozen=True, slots=True)
class DirMarks:
    """What a clean stop recorded: when, and each directory's mtime by its path under the
    data dir."""

    written_ns: int
    mtimes: dict[str, int]

    def unchanged(self, rel: str, st: os.stat_result) -> bool:
        recorded = self.mtimes.get(rel)
        return recorded == st.st_mtime_ns and recorded < self.written_ns - _COARSE_NS


def mark_clean_stop(data_dir: Path) -> None:
    """Leave ``modes.clean`` for the next start (call once the daemon wrote its last file)."""
    mtimes: dict[str, int] = {}
    for root, _dirs, _files in os.walk(data_dir):
        try:
            mtimes[os.path.relpath(root, data_dir)] = os.lstat(root).st_mtime_ns
        except FileNotFoundError:
            continue
    body = orjson.dumps({"version": _MARKER_VERSION, "writtenNs": time.time_ns(), "dirs": mtimes})
    path = data_dir / MARKER_NAME
    tmp = path.with_name(MARKER_NAME + ".tmp")
    # Not fsynced: a marker lost to a power cut only costs the next start its full audit.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, body)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def take_clean_stop(data_dir: Path) -> DirMarks | None:
    """Remove ``modes.clean`` and return what it recorded; None without one (a crash) or when
    it cannot be read, and then the audit walks every file."""
    path = data_dir / MARKER_NAME
    try:
        body = path.read_bytes()
        path.unlink()
    except OSError:
        return None
    try:
        obj = orjson.loads(body)
        dirs = obj["dirs"]
        if obj["version"] != _MARKER_VERSION or not isinstance(dirs, dict):
            return None
        return DirMarks(int(obj["writtenNs"]), {str(rel): int(m) for rel, m in dirs.items()})
    except (ValueError, KeyError, TypeError):
        return None


def find_exposed(data_dir: Path, since: DirMarks | None = None) -> Exposure:
    """Every entry of ``data_dir`` (itself included) with group/other read or write bits;
    ``since`` a clean stop, only what may have changed since (see the module docstring).

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

    def walk(top: str) -> None:
        for root, dirs, files in os.walk(top):
            for name in [*dirs, *files]:
                path = os.path.join(root, name)
                try:
                    check(path, os.lstat(path))
                except FileNotFoundError:
                    continue  # removed while we looked

    try:
        check(str(data_dir), os.lstat(data_dir))
    except FileNotFoundError:
        return Exposure((), 0)
    if since is None:
        walk(str(data_dir))
        return Exposure(tuple(named), count)
    for rel in since.mtimes:
        top = os.path.normpath(os.path.join(data_dir, rel))
        try:
            st = os.lstat(top)
        except FileNotFoundError:
            continue
        if rel != ".":
            check(top, st)  # each recorded directory is checked in its own turn
        if not stat.S_ISDIR(st.st_mode) or since.unchanged(rel, st):
            continue
        with os.scandir(top) as entries:
            for entry in entries:
                if os.path.relpath(entry.path, data_dir) in since.mtimes:
                    continue
                try:
                    check(entry.path, entry.stat(follow_symlinks=False))
                    if entry.is_dir(follow_symlinks=False):
                        walk(entry.path)  # a directory new since the stop: all of it
                except FileNotFoundError:
                    continue
    return Exposure(tuple(named), count)
