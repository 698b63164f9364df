"""Repairing the tail a crash may leave behind in a transcript.

Every good line ends with ``\\n`` and is written whole by one ``write``
(:mod:`sessions.transcript`), so bytes after the last line that parses are a torn write.
:func:`recover_tail` walks back from the end to that line, copies every byte after it to
``<file>.corrupt-<UTC timestamp>``, and truncates the file there. It never removes a line that
parses.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import structlog

from .errors import StorageError
from .fileio import FileIO, describe_os_error, open_no_links
from .models import format_ts
from .transcript import blocks_forward, end_of_last_newline, iter_lines_backward, parse_line

__all__ = ["Recovery", "find_good_end", "recover_tail"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Recovery:
    """A tail that was moved aside."""

    moved_bytes: int
    kept_bytes: int
    corrupt_path: Path


def find_good_end(fd: int, size: int) -> int:
    """Offset just after the last line that parses: everything past it is a bad tail."""
    for offset, raw in iter_lines_backward(fd, end_of_last_newline(fd, size)):
        if parse_line(raw) is not None:
            return offset + len(raw) + 1
    return 0


def _corrupt_stamp() -> str:
    # Compact (no colons) so the name is valid on every file system the data dir may sit on.
    return format_ts(datetime.now(UTC)).replace("-", "").replace(":", "").replace(".", "")


def _write_all(io: FileIO, fd: int, data: bytes) -> None:
    while data:
        written = io.write(fd, data)
        if written <= 0:
            raise OSError(28, os.strerror(28))  # ENOSPC: a write that makes no progress
        data = data[written:]


def _copy_aside(io: FileIO, src_fd: int, path: Path, start: int, end: int, durable: bool) -> Path:
    """Copy bytes ``[start, end)`` to a fresh ``<file>.corrupt-<ts>`` file and return its path."""
    stamp = _corrupt_stamp()
    for attempt in range(100):
        suffix = f".corrupt-{stamp}" + (f"-{attempt}" if attempt else "")
        target = path.with_name(path.name + suffix)
        try:
            out = open_no_links(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                                what="a corrupt tail's copy")
            break
        except FileExistsError:
            continue
    else:  # pragma: no cover - a hundred recoveries of one file in one millisecond
        raise StorageError("could not name a file for a corrupt transcript tail")
    try:
        for chunk in blocks_forward(src_fd, start, end):
            _write_all(io, out, chunk)
        if durable:
            io.fsync(out)
    except OSError:
        os.close(out)
        target.unlink(missing_ok=True)
        raise
    os.close(out)
    return target


def recover_tail(path: Path, io: FileIO, *, durable: bool) -> Recovery | None:
    """Move a bad tail aside and cut the file back to its last good line; None if it was fine.

    When no line at all parses (a header torn at creation), the bad bytes are saved and the
    now-empty transcript is removed: the session never finished being created. Raises
    :class:`StorageError` if the bad bytes cannot be saved, leaving the file untouched, since
    truncating without a copy would destroy the only record of them.
    """
    try:
        # A link is refused (UnsafePath), never followed: this may cut a file back.
        fd = open_no_links(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            # A crash between creating the file and writing its header: nothing to keep.
            path.unlink(missing_ok=True)
            log.warning("transcript.removed_empty", path=str(path))
            return None
        good = find_good_end(fd, size)
        if good == size:
            return None
        corrupt = _copy_aside(io, fd, path, good, size, durable)
        os.ftruncate(fd, good)
        if durable:
            io.fsync(fd)
    except OSError as err:
        raise StorageError(
            describe_os_error(err, "repairing a damaged transcript tail"), errno=err.errno
        ) from err
    finally:
        os.close(fd)
    log.warning(
        "transcript.recovered",
        path=str(path),
        bytes=size - good,
        kept_bytes=good,
        corrupt_path=str(corrupt),
    )
    if good == 0:
        path.unlink(missing_ok=True)
        log.warning("transcript.removed_empty", path=str(path))
    return Recovery(size - good, good, corrupt)
