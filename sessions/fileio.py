"""The file layer under the store: one injectable seam for writes and fsyncs.

:class:`FileIO` is how fault tests reach the disk without mocking the store: pass
``SessionStore(data_dir, config, file_io=FileIO(write=fails_with_enospc))`` and every
transcript write goes through that callable. The defaults look ``os.write`` / ``os.fsync`` up at
call time, so ``monkeypatch.setattr(os, "write", …)`` works too for tests that build the store
indirectly (through the gateway).
"""

from __future__ import annotations

import errno as errno_codes
import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from .config import FsyncPolicy
from .errors import StorageError, UnsafePath

__all__ = [
    "Durability",
    "FileIO",
    "append_line",
    "append_whole_line",
    "check_free_space",
    "create_with_line",
    "describe_os_error",
    "fsync_path",
    "open_no_links",
    "truncate_back",
]

FILE_MODE = 0o600  # transcripts are private conversations
# A link in the last component fails O_NOFOLLOW with ELOOP, or with ENOTDIR under O_DIRECTORY;
# a FIFO fails a non-blocking open for writing with ENXIO.
_REFUSED = (errno_codes.ELOOP, errno_codes.ENOTDIR, errno_codes.ENXIO)

log = structlog.get_logger(__name__)


def _os_write(fd: int, data: bytes) -> int:
    return os.write(fd, data)


def _os_fsync(fd: int) -> None:
    os.fsync(fd)


@dataclass(frozen=True, slots=True)
class FileIO:
    """The two system calls whose failures matter: ``write`` (ENOSPC, EIO, short writes) and
    ``fsync`` (EIO after the fact)."""

    write: Callable[[int, bytes], int] = _os_write
    fsync: Callable[[int], None] = _os_fsync


def open_no_links(path: Path, flags: int, mode: int = FILE_MODE, *,
                  what: str = "the transcript") -> int:
    """``os.open`` of a file in a user's directory (``<root>/<user>/<name>``) through no link.

    The directory is opened with ``O_NOFOLLOW``, then the file relative to it with
    ``O_NOFOLLOW``, so a link planted as the user's directory or as the file is refused, never
    followed; what is opened must be a regular file (``O_NONBLOCK`` keeps a planted FIFO from
    blocking the open forever). :class:`UnsafePath` names ``what`` was refused; any other
    ``OSError``, ``FileNotFoundError`` included, propagates as it is.
    """
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        if err.errno in _REFUSED:
            raise UnsafePath("the user's directory") from err
        raise
    try:
        fd = os.open(path.name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode,
                     dir_fd=dir_fd)
    except OSError as err:
        if err.errno in _REFUSED:
            raise UnsafePath(what) from err
        raise
    finally:
        os.close(dir_fd)
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        os.close(fd)
        raise
    if not regular:
        os.close(fd)
        raise UnsafePath(what)
    return fd


def describe_os_error(err: OSError, action: str) -> str:
    """``"no space left on device while appending to transcript"``: what, then while doing what."""
    if err.errno is not None:
        what = os.strerror(err.errno)
    else:
        what = str(err) or err.__class__.__name__
    return f"{what[:1].lower()}{what[1:]} while {action}"


def append_whole_line(io: FileIO, fd: int, line: bytes, prev_size: int, action: str) -> None:
    """Write ``line`` with one ``write`` on an ``O_APPEND`` descriptor, or leave no trace.

    One call for the whole line is what keeps concurrent readers and a crash from ever seeing
    half of it interleaved with another line. If the write fails or comes up short the file is
    cut back to ``prev_size`` so the transcript still ends on a whole line, and
    :class:`StorageError` says what went wrong. Should even the truncate fail, the torn tail is
    left for tail recovery on the next open (the caller forgets that it validated this file).
    """
    try:
        written = io.write(fd, line)
    except OSError as err:
        truncate_back(fd, prev_size)
        raise StorageError(describe_os_error(err, action), errno=err.errno) from err
    if written != len(line):
        truncate_back(fd, prev_size)
        # A short write on a regular file almost always means the disk filled up mid-line.
        raise StorageError(
            f"short write ({written} of {len(line)} bytes, disk full?) while {action}",
            errno=errno_codes.ENOSPC,
        )


def truncate_back(fd: int, size: int) -> None:
    """Cut a file back to ``size`` after a failed append; a failure here is logged, not raised."""
    try:
        os.ftruncate(fd, size)
    except OSError as err:
        log.error("transcript.truncate_failed", size=size, error=str(err))


def check_free_space(path: Path, floor: int) -> None:
    """StorageError (ENOSPC) when the file system of ``path`` has less than ``floor`` bytes
    free for unprivileged writers: refuse a write while there is still room to refuse it."""
    if floor <= 0:
        return
    try:
        st = os.statvfs(path)
    except OSError as err:
        raise StorageError(describe_os_error(err, "checking free disk space"),
                           errno=err.errno) from err
    free = st.f_bavail * st.f_frsize
    if free < floor:
        raise StorageError(
            f"disk almost full: {free} bytes free, below sessions.min_free_bytes ({floor}); "
            "nothing was written",
            errno=errno_codes.ENOSPC,
        )


def fsync_path(io: FileIO, path: Path) -> None:
    """fsync a file or directory by path (fsync on any descriptor flushes the whole inode).

    A path that vanished meanwhile (the session was deleted) has nothing left to make durable.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        io.fsync(fd)
    finally:
        os.close(fd)


def create_with_line(io: FileIO, path: Path, line: bytes, *, sync: bool) -> None:
    """Create ``path`` (it must not exist) holding exactly ``line``, or leave no file at all."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
    try:
        fd = open_no_links(path, flags)
    except OSError as err:
        raise StorageError(describe_os_error(err, "creating transcript"), errno=err.errno) from err
    try:
        append_whole_line(io, fd, line, 0, "creating transcript")
        if sync:
            io.fsync(fd)
    except (StorageError, OSError) as err:
        os.close(fd)
        # A header-less file would only be swept up by recovery later; remove it now.
        path.unlink(missing_ok=True)
        if isinstance(err, StorageError):
            raise
        raise StorageError(
            describe_os_error(err, "syncing new transcript"), errno=err.errno
        ) from err
    os.close(fd)


def append_line(io: FileIO, path: Path, line: bytes, *, sync: bool) -> int:
    """Append ``line`` to an existing file and return the new size.

    The caller must hold the only right to write this file (the store's stripe lock): the
    size read before the write is then exactly where the line lands, which is what a failed
    write is cut back to. ``FileNotFoundError`` propagates (the session was deleted).
    """
    try:
        fd = open_no_links(path, os.O_WRONLY | os.O_APPEND)
    except FileNotFoundError:
        raise  # not a disk failure: the caller turns it into SessionNotFound
    except OSError as err:
        raise StorageError(describe_os_error(err, "opening transcript"), errno=err.errno) from err
    try:
        prev_size = os.fstat(fd).st_size
        append_whole_line(io, fd, line, prev_size, "appending to transcript")
        if sync:
            try:
                io.fsync(fd)
            except OSError as err:
                # Not known to be on disk, so report it unwritten and make it so.
                truncate_back(fd, prev_size)
                raise StorageError(
                    describe_os_error(err, "syncing transcript to disk"), errno=err.errno
                ) from err
    finally:
        os.close(fd)
    return prev_size + len(line)


class Durability:
    """The ``sessions.fsync`` policy in one place, with the set of paths awaiting an fsync.

    ``"always"`` syncs inside the write call (see ``sync_each_write``) and here for directory
    entries; ``"batch"`` remembers paths until :meth:`flush`; ``"never"`` does nothing.
    Thread-safe: the dirty set has its own lock, held only for set operations.
    """

    def __init__(self, policy: FsyncPolicy, io: FileIO) -> None:
        self.policy = policy
        self._io = io
        self._lock = threading.Lock()
        self._dirty: set[Path] = set()
        # Paths whose open failure was logged: a flood of EMFILE fails every pass, so each is
        # logged once until it is synced, not once a tick.
        self._unopened_logged: set[Path] = set()

    @property
    def sync_each_write(self) -> bool:
        return self.policy == "always"

    @property
    def enabled(self) -> bool:
        return self.policy != "never"

    def written(self, *paths: Path) -> None:
        """Files were written or directories gained or lost entries: make that durable."""
        if self.policy == "always":
            for path in paths:
                try:
                    fsync_path(self._io, path)
                except OSError as err:
                    raise StorageError(
                        describe_os_error(err, "syncing to disk"), errno=err.errno
                    ) from err
        elif self.policy == "batch":
            with self._lock:
                self._dirty.update(paths)

    def appended(self, path: Path) -> None:
        """A transcript grew; under "always" the write already synced it."""
        if self.policy == "batch":
            with self._lock:
                self._dirty.add(path)

    def forget(self, path: Path) -> None:
        with self._lock:
            self._dirty.discard(path)

    def flush(self) -> None:
        """fsync every path written since the last flush.

        Tries them all; if any fails, logs each and raises one StorageError at the end. A path
        that could not even be opened (EMFILE under a descriptor flood, ENFILE) was never
        synced, so it stays in the set for the next flush (logged once, not on every pass). One
        whose fsync failed does not: after a failed fsync the kernel may already have dropped the
        pages, so a retry that succeeded would only lie.
        """
        with self._lock:
            dirty, self._dirty = self._dirty, set()
        failed: OSError | None = None
        unopened: set[Path] = set()
        # Files before their directories: a directory entry should not outlive its data.
        for path in sorted(dirty, key=lambda p: (not p.name.endswith(".jsonl"), str(p))):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # deleted meanwhile: nothing left to make durable
            except OSError as err:
                if path not in self._unopened_logged:
                    log.error("transcript.fsync_failed", path=str(path), error=str(err), kept=True)
                unopened.add(path)
                failed = failed or err
                continue
            try:
                self._io.fsync(fd)
            except OSError as err:
                log.error("transcript.fsync_failed", path=str(path), error=str(err))
                failed = failed or err
            finally:
                os.close(fd)
        with self._lock:
            self._dirty |= unopened
            # Every path still unopened has now been logged; one synced (or gone) may be
            # logged again if it fails later. Two flushes racing cost at most a repeated line.
            self._unopened_logged = unopened
        if failed is not None:
            raise StorageError(
                describe_os_error(failed, "syncing transcripts to disk"), errno=failed.errno
            )
