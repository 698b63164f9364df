"""Reading a transcript forward from a byte offset, complete lines only, in bounded memory.

The store reads *backwards* (history pages, see :mod:`sessions.transcript`); a follower such as
the memory indexer reads *forwards*: from where it stopped last time to the last complete line.
Both apply the same rules to a line — :func:`~sessions.transcript.parse_line` then
:meth:`Message.from_line` — so a reader accepts exactly the message lines the store writes and
returns them as the store's own :class:`~sessions.models.Message`.

A trailing line without its ``\\n`` is being written (or was torn by a crash, and recovery will
move it aside): it is never consumed, and :attr:`ForwardReader.end_offset` stops before it so a
later read picks it up once it is whole. The file is read in 64 KiB blocks; memory use is one
block plus the longest line, whatever the size of the transcript.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from .models import Message
from .transcript import parse_line

__all__ = ["ForwardReader", "TranscriptEntry"]

_BLOCK = 64 * 1024


def _no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW)


class TranscriptEntry(NamedTuple):
    """One message line, with where it sits in its file (a NamedTuple: one is made per line read,
    five times faster than a frozen dataclass; memory.chunking's Unit says more)."""

    line: int        # 1-based line number (the header is line 1)
    offset: int      # byte offset of the line's first byte
    message: Message


class ForwardReader:
    """The messages of ``path`` on complete lines from ``offset``, which must be the start of
    line number ``line``.

    Iterate it (once) for :class:`TranscriptEntry` values. While and after iterating,
    :attr:`end_offset` is the offset just past the last complete line read and :attr:`end_line`
    that line's number (``line - 1`` when none was read): where the next read starts.
    :attr:`skipped` counts lines that are neither blank, nor a message, nor another known kind
    of line (the header): what the store would log as ``transcript.bad_line``.
    """

    def __init__(self, path: Path, offset: int = 0, line: int = 1) -> None:
        self.path = path
        self.end_offset = offset
        self.end_line = line - 1
        self.skipped = 0

    def __iter__(self) -> Iterator[TranscriptEntry]:
        # O_NOFOLLOW: a link planted as the transcript raises ELOOP here, never read through.
        with open(self.path, "rb", opener=_no_follow) as fh:
            fh.seek(self.end_offset)
            parts: list[bytes] = []  # fragments of a line whose newline is not read yet
            while block := fh.read(_BLOCK):
                pos = 0
                newline = block.find(b"\n")
                while newline != -1:
                    parts.append(block[pos:newline])
                    raw = b"".join(parts)
                    parts.clear()
                    start = self.end_offset
                    self.end_offset = start + len(raw) + 1
                    self.end_line += 1
                    entry = self._entry(raw, self.end_line, start)
                    if entry is not None:
                        yield entry
                    pos = newline + 1
                    newline = block.find(b"\n", pos)
                parts.append(block[pos:])

    def _entry(self, raw: bytes, line: int, offset: int) -> TranscriptEntry | None:
        if not raw.strip():
            return None
        obj = parse_line(raw)
        if obj is not None and obj["type"] != "message":
            return None  # the header, or a kind of line a later version may add
        message = Message.from_line(obj) if obj is not None else None
        if message is None:
            self.skipped += 1
            return None
        return TranscriptEntry(line, offset, message)
