"""The clean-shutdown marker: what lets a start after a clean stop skip stat-ing every transcript.

:meth:`SessionStore.close` writes ``<data_dir>/sessions.clean`` once every transcript is flushed
and the index is closed: the modification times of the sessions directory and of each user's
directory at that moment. Every open takes the marker away before it reads anything (and makes
the removal durable when fsync is on), so a run that crashes leaves none and the start after it
does the full reconcile, which also cuts torn tails.

A start that finds the marker (and was asked to trust it) stats only the user directories. A
transcript copied in, renamed or deleted while the daemon was down changed its directory's
mtime, so only such directories are scanned file by file. An append to an existing transcript
changes no directory, so the store re-checks every transcript in a background thread after
such a start (:meth:`SessionStore.catch_up`), and a session's first use compares its size with
its row anyway. A directory modified within :data:`_COARSE_NS` before the marker was written
counts as changed, for file systems whose mtimes are coarser than the writes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import orjson
import structlog

from .fileio import FILE_MODE
from .keys import is_user_name

__all__ = ["MARKER_NAME", "DirStamps", "changed_users", "stamp_dirs", "take_marker", "write_marker"]

log = structlog.get_logger(__name__)

MARKER_NAME = "sessions.clean"
_VERSION = 1
# FAT has 2 s mtimes, some network file systems 1 s: a change this close to the stamp may hide.
_COARSE_NS = 2_000_000_000

DirStamps = dict[str, int]  # user name -> its directory's st_mtime_ns


def stamp_dirs(root: Path) -> DirStamps:
    """The mtime of every well-named user directory under ``root`` (one ``stat`` each)."""
    stamps: DirStamps = {}
    try:
        entries = os.scandir(root)
    except FileNotFoundError:
        return stamps
    with entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False) and is_user_name(entry.name):
                stamps[entry.name] = entry.stat(follow_symlinks=False).st_mtime_ns
    return stamps


def write_marker(data_dir: Path, root: Path, *, durable: bool) -> None:
    """Record a clean stop; a failure only costs the next start its full reconcile."""
    body = orjson.dumps({"version": _VERSION, "writtenNs": time.time_ns(),
                         "users": stamp_dirs(root)})
    path = Path(data_dir) / MARKER_NAME
    tmp = path.with_name(MARKER_NAME + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                     FILE_MODE)
        try:
            os.write(fd, body)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        if durable:
            _fsync_dir(path.parent)
    except OSError as err:
        log.warning("sessions.clean_marker_failed", path=str(path), error=str(err))


def take_marker(data_dir: Path, *, durable: bool) -> tuple[int, DirStamps] | None:
    """Remove the marker and return what it recorded (when it was written, the stamps), or
    None when there was none or it cannot be read: then the caller does the full reconcile."""
    path = Path(data_dir) / MARKER_NAME
    try:
        body = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError:
        body = b""
    try:
        path.unlink()
        if durable:
            _fsync_dir(path.parent)
    except OSError as err:
        # A marker that stays could vouch for a later run that crashed: never trust it then.
        log.warning("sessions.clean_marker_stuck", path=str(path), error=str(err))
        return None
    try:
        obj = orjson.loads(body)
        users = obj["users"]
        if obj["version"] != _VERSION or not isinstance(users, dict):
            return None
        written = int(obj["writtenNs"])
        return written, {str(u): int(m) for u, m in users.items()}
    except (ValueError, KeyError, TypeError):
        return None


def _fsync_dir(path: Path) -> None:
    # Not through the store's FileIO seam: that one counts and fails transcript syncs in tests.
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def changed_users(before: tuple[int, DirStamps], now: DirStamps) -> tuple[list[str], list[str]]:
    """``(users to rescan, users gone)``: a user directory that is new, has another mtime, or
    was modified too close to the marker's writing to be sure; and one that is no longer there."""
    written, stamps = before
    rescan = [user for user, mtime in now.items()
              if stamps.get(user) != mtime or mtime >= written - _COARSE_NS]
    gone = [user for user in stamps if user not in now]
    return rescan, gone
