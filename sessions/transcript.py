"""Reading transcripts: the line format, the header, history pages read backwards.

A transcript is ``<data>/sessions/<user>/<sessionKey>.jsonl``: a header line, then one JSON
line per message, each written whole by one ``write``. Two facts follow and everything here
leans on them:

* every good line ends with ``\\n``, so bytes after the last newline are a torn write;
* lines are only ever added at the end, so a line's byte offset never changes. History pages
  are addressed by byte offset and read *backwards* from the end in 64 KiB blocks: the last N
  messages cost O(size of those N lines), not O(size of the file).

Repairing the tail a crash may leave behind is :mod:`sessions.recovery`'s. Lines in the
*middle* that do not parse (only a hand edit can make them) are skipped when reading and
logged, never fatal.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson
import structlog

from .errors import InvalidSessionInput, SessionNotFound, StorageError
from .fileio import describe_os_error, open_no_links
from .models import SUMMARY_TYPE, ConversationSummary, Message, Session, to_ts

__all__ = [
    "Header",
    "Summary",
    "blocks_forward",
    "end_of_last_newline",
    "header_of",
    "iter_lines_backward",
    "memory_enabled",
    "open_sized",
    "parse_line",
    "read_header",
    "read_messages_backward",
    "read_page",
    "read_summary_backward",
    "summarise",
]

log = structlog.get_logger(__name__)

_BLOCK = 64 * 1024
# A header line is a few hundred bytes: the first read of one is this small, so checking a
# file's header does not copy the first 64 KiB of its messages (the indexer checks every changed
# transcript's).
_HEADER_BLOCK = 4096
# A header holds the system prompt, bounded by max_line_bytes when written; this cap only
# stops a file with no newline at all from being read whole into memory to look for one.
_MAX_HEADER_BYTES = 64 * 1024 * 1024
HEADER_VERSION = 1
# A line that changes the header's title or system prompt after creation (``sessions.update``);
# orjson keeps key order, so every such line the store writes starts with these bytes.
UPDATE_TYPE = "update"
UPDATE_PREFIX = b'{"type":"update"'
# A conversation summary line (``SessionStore.append_summary``): not a message either.
SUMMARY_PREFIX = b'{"type":"' + SUMMARY_TYPE.encode() + b'"'


@dataclass(frozen=True, slots=True)
class Header:
    """Line 1 of a transcript."""

    session_key: str
    user: str
    created_at: str
    title: str
    system_prompt: str | None = None
    model: str | None = None
    # False: an incognito session — kept, but never indexed, recalled or remembered from.
    memory: bool = True
    # Chosen by sessions.update (an ``update`` line), so a header only has them when written so
    # by hand or an import; None: nothing is sent, the endpoint's default applies.
    temperature: float | None = None
    max_tokens: int | None = None

    def to_line(self) -> dict[str, Any]:
        line: dict[str, Any] = {
            "type": "session",
            "version": HEADER_VERSION,
            "sessionKey": self.session_key,
            "user": self.user,
            "createdAt": self.created_at,
            "title": self.title,
        }
        if self.system_prompt is not None:
            line["systemPrompt"] = self.system_prompt
        if self.model is not None:
            line["model"] = self.model
        if not self.memory:
            line["memory"] = False
        if self.temperature is not None:
            line["temperature"] = self.temperature
        if self.max_tokens is not None:
            line["maxTokens"] = self.max_tokens
        return line

    @classmethod
    def from_line(cls, obj: Mapping[str, Any]) -> Header | None:
        key, user, created, title = (
            obj.get("sessionKey"), obj.get("user"), obj.get("createdAt"), obj.get("title"),
        )
        prompt, model = obj.get("systemPrompt"), obj.get("model")
        if not (
            obj.get("type") == "session"
            and obj.get("version") == HEADER_VERSION
            and isinstance(key, str)
            and isinstance(user, str)
            and isinstance(created, str)
            and isinstance(title, str)
            and (prompt is None or isinstance(prompt, str))
            and (model is None or isinstance(model, str))
        ):
            return None
        try:
            created = to_ts(created)
        except ValueError:
            return None
        return cls(key, user, created, title, prompt, model, obj.get("memory") is not False,
                   _temperature(obj.get("temperature")), _max_tokens(obj.get("maxTokens")))

    def updated(self, obj: Mapping[str, Any] | None) -> Header:
        """This header with an ``update`` line's title, system prompt, model and sampling
        applied (``null`` for one of the last three: back to the default). A malformed line
        changes nothing: the header stays what it was."""
        if obj is None or obj.get("type") != UPDATE_TYPE:
            return self
        title, prompt = obj.get("title", self.title), obj.get("systemPrompt", self.system_prompt)
        model = obj.get("model", self.model)
        temperature = _temperature(obj["temperature"]) if "temperature" in obj else self.temperature
        max_tokens = _max_tokens(obj["maxTokens"]) if "maxTokens" in obj else self.max_tokens
        if (not isinstance(title, str) or not (prompt is None or isinstance(prompt, str))
                or not (model is None or isinstance(model, str))):
            return self
        # replace(), not a new Header: every other field (the incognito flag among them) stays.
        return replace(self, title=title, system_prompt=prompt, model=model,
                       temperature=temperature, max_tokens=max_tokens)


def _temperature(value: object) -> float | None:
    # A hand-edited line may hold anything: only a number is a temperature (else the default).
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    return None


def _max_tokens(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


@dataclass(frozen=True, slots=True)
class Summary:
    """What the metadata index needs from one transcript."""

    header: Header
    header_end: int
    message_count: int
    updated_at: str
    size: int

    def session(self, user: str) -> Session:
        h = self.header
        return Session(
            session_key=h.session_key,
            user=user,
            title=h.title,
            created_at=h.created_at,
            updated_at=self.updated_at,
            message_count=self.message_count,
            system_prompt=h.system_prompt,
            model=h.model,
            memory=h.memory,
            temperature=h.temperature,
            max_tokens=h.max_tokens,
        )


def parse_line(raw: bytes) -> dict[str, Any] | None:
    """A line as a dict with a string ``type``, or None (not JSON, bad UTF-8, wrong shape)."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if isinstance(obj, dict) and isinstance(obj.get("type"), str):
        return obj
    return None


def _pread_exact(fd: int, size: int, offset: int) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:
        # Only a truncation by someone else can do this; report it like any read failure.
        raise OSError(5, "transcript shrank while being read")
    return data


def iter_lines_backward(fd: int, end: int) -> Iterator[tuple[int, bytes]]:
    """``(offset, line)`` for each line in ``[0, end)``, last first, newline stripped.

    ``end`` must sit just after a newline (or be 0). Fragments of a line spanning several
    blocks are joined once, so a long line costs its length, not its length squared.
    """
    if end <= 0:
        return
    pos = end - 1  # the newline that ends the last line is not part of it
    parts: list[bytes] = []
    while pos > 0:
        start = max(0, pos - _BLOCK)
        chunk = _pread_exact(fd, pos - start, start)
        pos = start
        right = len(chunk)
        idx = chunk.rfind(b"\n", 0, right)
        while idx != -1:
            parts.append(chunk[idx + 1 : right])
            yield start + idx + 1, b"".join(reversed(parts))
            parts.clear()
            right = idx
            idx = chunk.rfind(b"\n", 0, right)
        parts.append(chunk[:right])
    yield 0, b"".join(reversed(parts))


def blocks_forward(fd: int, start: int, end: int) -> Iterator[bytes]:
    """Bytes ``[start, end)`` in blocks of at most ``_BLOCK``, first to last."""
    pos = start
    while pos < end:
        chunk = _pread_exact(fd, min(_BLOCK, end - pos), pos)
        yield chunk
        pos += len(chunk)


def _lines_forward(fd: int, start: int, end: int) -> Iterator[bytes]:
    """Each line in ``[start, end)`` (``end`` just after a newline), first to last, newline
    stripped; a line spanning blocks is joined once."""
    carry: list[bytes] = []
    for chunk in blocks_forward(fd, start, end):
        pieces = chunk.split(b"\n")
        if len(pieces) == 1:
            carry.append(chunk)
            continue
        carry.append(pieces[0])
        yield b"".join(carry)
        yield from pieces[1:-1]
        carry = [pieces[-1]]


def end_of_last_newline(fd: int, size: int) -> int:
    """Offset just after the last ``\\n`` in the first ``size`` bytes; 0 if there is none."""
    pos = size
    while pos > 0:
        start = max(0, pos - _BLOCK)
        idx = _pread_exact(fd, pos - start, start).rfind(b"\n")
        if idx != -1:
            return start + idx + 1
        pos = start
    return 0


def open_sized(path: Path) -> tuple[int, int]:
    """A read-only descriptor on the transcript and its size; SessionNotFound if it is gone,
    StorageError for any other failure (UnsafePath for a link)."""
    try:
        fd = open_no_links(path, os.O_RDONLY)
    except FileNotFoundError:
        raise SessionNotFound() from None
    except OSError as err:
        raise StorageError(describe_os_error(err, "reading transcript")) from err
    try:
        return fd, os.fstat(fd).st_size
    except OSError as err:
        os.close(fd)
        raise StorageError(describe_os_error(err, "reading transcript")) from err


def header_of(path: Path) -> tuple[int, tuple[Header, int] | None]:
    """The transcript's size and :func:`read_header`'s answer; FileNotFoundError when it is
    gone, StorageError for any other failure (UnsafePath for a link)."""
    try:
        fd = open_no_links(path, os.O_RDONLY)
    except FileNotFoundError:
        raise
    except OSError as err:
        raise StorageError(describe_os_error(err, "opening transcript")) from err
    try:
        size = os.fstat(fd).st_size
        return size, read_header(fd, size)
    except OSError as err:
        raise StorageError(describe_os_error(err, "reading transcript")) from err
    finally:
        os.close(fd)


def memory_enabled(path: Path) -> bool:
    """Whether the memory index may read this transcript: False for an incognito session's
    (header ``"memory": false``). A missing file or unreadable header answers True, so the
    indexer goes on to its own handling of those (it refuses a link)."""
    try:
        fd = open_no_links(path, os.O_RDONLY)
    except (OSError, StorageError):
        return True
    try:
        found = read_header(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    return found is None or found[0].memory


def read_header(fd: int, size: int) -> tuple[Header, int] | None:
    """The header and the offset just after it, or None when line 1 is not a valid header."""
    pos = 0
    parts: list[bytes] = []
    block = _HEADER_BLOCK
    while pos < min(size, _MAX_HEADER_BYTES):
        chunk = os.pread(fd, min(block, size - pos), pos)
        block = _BLOCK
        if not chunk:
            return None
        idx = chunk.find(b"\n")
        if idx != -1:
            parts.append(chunk[:idx])
            obj = parse_line(b"".join(parts))
            header = Header.from_line(obj) if obj is not None else None
            return (header, pos + idx + 1) if header is not None else None
        parts.append(chunk)
        pos += len(chunk)
    return None


def _bad_line(path: Path | None, offset: int) -> None:
    log.warning("transcript.bad_line", path=str(path) if path else None, offset=offset)


def _messages_backward(
    fd: int, end: int, header_end: int, path: Path | None
) -> Iterator[tuple[int, int, Message]]:
    """``(offset, line bytes, message)`` for each message line ending before ``end``, newest
    first; other kinds of line are skipped and unreadable ones logged."""
    for offset, raw in iter_lines_backward(fd, end):
        if offset < header_end:
            return
        obj = parse_line(raw)
        if obj is not None and obj["type"] != "message":
            continue  # another kind of line (a later version may add some): not a message
        msg = Message.from_line(obj) if obj is not None else None
        if msg is None:
            _bad_line(path, offset)
            continue
        yield offset, len(raw) + 1, msg


def read_messages_backward(
    fd: int, end: int, header_end: int, limit: int, path: Path | None = None
) -> list[tuple[int, Message]]:
    """Up to ``limit`` messages ending before offset ``end``, newest first, with their offsets."""
    found: list[tuple[int, Message]] = []
    if limit <= 0:
        return found
    for offset, _, msg in _messages_backward(fd, end, header_end, path):
        found.append((offset, msg))
        if len(found) >= limit:
            break
    return found


def summarise(path: Path) -> Summary | None:
    """Header, line count and last message time of a transcript; None if its header is bad.

    Read-only (repairs are :func:`recover_tail`'s job). Counting lines reads the whole file, in
    blocks; this runs only when the index learns of a transcript it did not write itself.
    UnsafePath for a link, which is never read.
    """
    try:
        fd = open_no_links(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        found = read_header(fd, size)
        if found is None:
            return None
        header, header_end = found
        end = end_of_last_newline(fd, size)
        count = 0
        for raw in _lines_forward(fd, header_end, end):
            if raw.startswith(UPDATE_PREFIX):
                header = header.updated(parse_line(raw))  # later updates win, as they did live
            elif not raw.startswith(SUMMARY_PREFIX):
                count += 1
        updated_at = header.created_at
        last = read_messages_backward(fd, end, header_end, 1, path)
        if last:
            try:
                updated_at = to_ts(last[0][1].ts)
            except ValueError:
                pass
        return Summary(header, header_end, count, updated_at, size)
    finally:
        os.close(fd)


def read_summary_backward(fd: int, end: int, header_end: int) -> ConversationSummary | None:
    """The newest well-formed summary line before offset ``end``, or None. Only lines starting
    with the summary prefix are parsed, so a transcript without one costs a scan, not a parse."""
    for offset, raw in iter_lines_backward(fd, end):
        if offset < header_end:
            return None
        if raw.startswith(SUMMARY_PREFIX):
            obj = parse_line(raw)
            found = ConversationSummary.from_line(obj) if obj is not None else None
            if found is not None:
                return found
    return None


def read_page(
    fd: int, size: int, header_end: int, limit: int, before: int | None, path: Path | None = None,
    max_bytes: int | None = None,
) -> tuple[list[tuple[int, Message]], bool]:
    """The ``limit`` messages just before offset ``before`` (default: the end), oldest first,
    with their offsets, and whether older messages remain.

    ``max_bytes`` caps the page by the size of its lines as well: the page stops before the
    message that would take it past the cap (it always holds at least one message, so paging
    moves on), and older messages then remain. ``before`` comes from a client's cursor, so it
    must be a line start inside the messages.
    """
    if limit <= 0:
        return [], False
    end = size if before is None else before
    if not header_end <= end <= size or (end > header_end and os.pread(fd, 1, end - 1) != b"\n"):
        raise InvalidSessionInput("before", "is not a cursor returned by this server")
    page: list[tuple[int, Message]] = []
    used = 0
    more = False
    for offset, line_bytes, msg in _messages_backward(fd, end, header_end, path):
        full = len(page) >= limit or (max_bytes is not None and len(page) > 0
                                      and used + line_bytes > max_bytes)
        if full:
            more = True  # this older message is left for the next page
            break
        page.append((offset, msg))
        used += line_bytes
    page.reverse()
    return page, more
