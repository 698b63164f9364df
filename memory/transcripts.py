"""Reading session transcripts (JSONL) from a byte offset, complete lines only.

The sessions package writes ``<data_dir>/sessions/<user>/<sessionKey>.jsonl``: line 1 a
``{"type":"session",…}`` header, then one ``{"type":"message",…}`` object per line. This
module reads them itself (memory does not import the writer). A trailing line without its
newline is still being written (or was torn by a crash) and is never consumed: the returned
``end_offset`` stops before it, so a later sync reads it once it is complete.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

__all__ = ["Message", "ReadResult", "iso_to_ms", "read_messages", "session_of"]


@dataclass(frozen=True, slots=True)
class Message:
    """One transcript message as the chunker needs it."""

    line: int        # 1-based line number in the file
    offset: int      # byte offset of the line's start
    role: str
    name: str | None
    content: str
    ts: str | None


@dataclass(frozen=True, slots=True)
class ReadResult:
    messages: list[Message]
    end_offset: int  # offset just past the last complete line read
    end_line: int    # number of the last complete line read (0 when none)


def session_of(rel_path: str) -> tuple[str, str] | None:
    """``"<user>/<key>.jsonl"`` → ``(user, key)``; None for any other shape."""
    parts = rel_path.split("/")
    if len(parts) != 2 or not parts[1].endswith(".jsonl") or not parts[0]:
        return None
    key = parts[1][: -len(".jsonl")]
    return (parts[0], key) if key else None


def iso_to_ms(ts: str | None) -> int | None:
    """ISO-8601 (``Z`` or offset; naive means UTC) → epoch milliseconds, None if unparsable."""
    if not ts:
        return None
    try:
        parsed = datetime.fromisoformat(ts)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI-style parts: keep the text ones
        texts = [p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        return "\n".join(t for t in texts if t)
    return ""


def _message_of(raw: bytes, line: int, offset: int) -> Message | None:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None  # garbage line: the sessions package moves torn tails aside; skip here
    if not isinstance(obj, dict) or obj.get("type") != "message":
        return None
    text = _text_of(obj.get("content")).strip()
    if not text:
        return None
    role = obj.get("role")
    name = obj.get("name")
    ts = obj.get("ts")
    return Message(
        line=line,
        offset=offset,
        role=role if isinstance(role, str) and role else "unknown",
        name=name if isinstance(name, str) and name.strip() else None,
        content=text,
        ts=ts if isinstance(ts, str) else None,
    )


def read_messages(path: Path, start_offset: int, start_line: int) -> ReadResult:
    """Messages on complete lines from ``start_offset`` (which is the start of ``start_line``)."""
    with path.open("rb") as fh:
        fh.seek(start_offset)
        data = fh.read()
    complete = data.rfind(b"\n") + 1
    messages: list[Message] = []
    line = start_line
    pos = 0
    while pos < complete:
        nl = data.index(b"\n", pos)
        raw = data[pos:nl]
        if raw.strip():
            msg = _message_of(raw, line, start_offset + pos)
            if msg is not None:
                messages.append(msg)
        pos = nl + 1
        line += 1
    return ReadResult(messages, start_offset + complete, line - 1)
