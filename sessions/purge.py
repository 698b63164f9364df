"""Forgetting messages for real: a transcript rewritten without some of its messages.

The kept lines go to a temporary file beside the transcript, which is fsynced and renamed over
it, then the directory is fsynced, so a crash leaves the old file or the new one, never a mix.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

import orjson

from .errors import SessionNotFound, StorageError
from .fileio import FileIO, append_whole_line, describe_os_error, fsync_path, open_no_links
from .models import SUMMARY_TYPE, parse_ts
from .supersede import REPLACES_KEY, retarget
from .transcript import parse_line

__all__ = ["rewrite_file", "without_messages"]


def without_messages(path: Path, header_end: int, after: datetime | None,
                     before: datetime | None) -> tuple[bytes, int]:
    """The transcript at ``path`` without its messages timed in ``[after, before)`` (every
    message when neither is given), and how many were removed; every other line stays byte
    for byte, but a conversation summary covering a removed message is left out too, and a kept
    message whose ``replaces`` names a removed one names the first kept message of the range it
    hid instead (or loses the key: :func:`sessions.supersede.retarget`). SessionNotFound if the file
    is gone; UnsafePath for a link, which is never read."""
    try:
        fd = open_no_links(path, os.O_RDONLY)
    except FileNotFoundError:
        raise SessionNotFound() from None
    except OSError as err:
        raise StorageError(describe_os_error(err, "reading transcript")) from err
    try:
        with os.fdopen(fd, "rb") as fh:
            data = fh.read()
    except OSError as err:
        raise StorageError(describe_os_error(err, "reading transcript")) from err
    lines = data[header_end:].splitlines(keepends=True)
    parsed = [parse_line(raw.rstrip(b"\n")) for raw in lines]
    order: list[str] = []
    gone: set[str] = set()
    targets: dict[str, str] = {}
    for obj in parsed:
        if obj is not None and obj["type"] == "message" and isinstance(obj.get("id"), str):
            order.append(obj["id"])
            if _within(obj.get("ts"), after, before):
                gone.add(obj["id"])
            elif isinstance(obj.get(REPLACES_KEY), str):
                targets[obj["id"]] = obj[REPLACES_KEY]
    moved = retarget(order, gone, targets)
    kept = [data[:header_end]]
    removed = 0
    position: dict[str, int] = {}  # message id -> its place among the messages read so far
    first_removed: int | None = None
    for raw, obj in zip(lines, parsed, strict=True):
        if obj is not None and obj["type"] == "message":
            if isinstance(obj.get("id"), str):
                position[obj["id"]] = len(position)
            if _within(obj.get("ts"), after, before):
                removed += 1
                if first_removed is None:
                    first_removed = len(position) - 1
                continue
            if obj.get("id") in moved:  # its target goes: what it hid must stay hidden, no more
                line = {k: v for k, v in obj.items() if k != REPLACES_KEY}
                if moved[obj["id"]] is not None:
                    line[REPLACES_KEY] = moved[obj["id"]]
                raw = orjson.dumps(line) + b"\n"
        elif obj is not None and obj["type"] == SUMMARY_TYPE and first_removed is not None:
            # A summary covers every message up to its ``through``: one that covers a removed
            # message would keep the forgotten text, so it goes too (an unknown ``through``
            # cannot be placed, and goes as well).
            through_id = obj.get("through")
            through = position.get(through_id) if isinstance(through_id, str) else None
            if through is None or through >= first_removed:
                continue
        kept.append(raw)
    return b"".join(kept), removed


def rewrite_file(io: FileIO, path: Path, content: bytes) -> None:
    """Replace ``path`` by ``content`` atomically and durably (see the module docstring)."""
    tmp = path.with_name(path.name + ".purge")
    try:
        fd = open_no_links(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND,
                           what="the rewritten transcript")
    except OSError as err:
        raise StorageError(describe_os_error(err, "rewriting transcript"), errno=err.errno) from err
    try:
        append_whole_line(io, fd, content, 0, "rewriting transcript")
        io.fsync(fd)
    except (StorageError, OSError) as err:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        if isinstance(err, StorageError):
            raise
        raise StorageError(describe_os_error(err, "syncing rewritten transcript"),
                           errno=err.errno) from err
    os.close(fd)
    try:
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise StorageError(describe_os_error(err, "replacing transcript"), errno=err.errno) from err
    fsync_path(io, path.parent)


def _within(ts: object, after: datetime | None, before: datetime | None) -> bool:
    """Whether a message time lies in [after, before). With no bound every message matches; a
    message whose time cannot be read cannot be placed in a bounded range and is kept."""
    if after is None and before is None:
        return True
    try:
        moment = parse_ts(ts) if isinstance(ts, str) else None
    except ValueError:
        moment = None
    if moment is None:
        return False
    return (after is None or moment >= after) and (before is None or moment < before)
