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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from .errors import StorageError

__all__ = ["FileIO", "append_whole_line", "describe_os_error", "fsync_path", "truncate_back"]

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
