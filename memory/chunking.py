"""Turning transcript messages into overlapping chunks. Pure functions, deterministic.

Input: the transcript's messages as the sessions package reads them (``TranscriptEntry``: the
message with its line number and byte offset). Rendering: each message is ``role [ts]: text``
(the speaker ``name`` replaces the role when present), its text stripped of surrounding
whitespace; a message with no text makes no chunk text. Messages in a chunk are joined by
newlines.

Token approximation (no tokenizer needed, stable across embedders): a text is split into
"words" — each CJK/kana/hangul character is one word, every other run of non-space characters
is one word — and a word costs ``ceil(len/4)`` tokens (at least 1), a CJK character 1. This
tracks BPE/WordPiece counts within ~20% for English prose and over-counts code a little.

Packing: a message that fits in ``chunk_tokens`` is one *unit*; a longer one is cut at word
boundaries into segments of at most ``overlap_tokens`` (min 8) tokens, each a unit (a single
word longer than that is the only thing ever cut inside, at a character count). Units are
packed greedily: a chunk takes units while they fit in ``chunk_tokens`` (always at least one).
The next chunk starts at the earliest unit of the previous chunk's tail that fits in
``overlap_tokens`` and still leaves room for the next new unit. So each chunk is a function of
its first unit and the units after it: re-packing from the last chunk's first unit yields the
same chunks as packing the whole transcript, which is what makes appends incremental.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import NamedTuple

from sessions import TranscriptEntry, replaced_id, visible_messages

__all__ = [
    "content_terms",
    "CJK_CHARS",
    "CONTINUED",
    "Chunk",
    "Unit",
    "approx_tokens",
    "chunk_messages",
    "fts_text",
    "iso_to_ms",
    "message_units",
    "pack_units",
    "sha256_text",
    "visible_entries",
]

# Han, kana, hangul, CJK punctuation and full-width forms: scripts written without spaces.
CJK_CHARS = (
    "\u3000-\u303f\u3040-\u309f\u30a0-\u30ff\u3400-\u4dbf\u4e00-\u9fff"
    "\uac00-\ud7af\uf900-\ufaff\uff00-\uffef\U00020000-\U0002fa1f"
)
_CJK_RE = re.compile(f"[{CJK_CHARS}]")
_WORD_RE = re.compile(f"[{CJK_CHARS}]|[^\\s{CJK_CHARS}]+")
# One match per approximate token: a CJK character, or up to 4 characters of another word (a
# word of n characters is ceil(n / 4) matches). Counting matches in C is the rule of
# _word_tokens summed over _WORD_RE's words without a Python step per word: that step was half
# of a keyword-only index build (bench/README.md, "Scale").
_TOKEN_RE = re.compile(f"[{CJK_CHARS}]|[^\\s{CJK_CHARS}]{{1,4}}")
_MIN_SEGMENT_TOKENS = 8
# Opens the rendered text of a message's later segment (memory.retrieval.neighbours reads it).
CONTINUED = "… "


_WORDS = re.compile(r"\w+", re.UNICODE)


def content_terms(text: str) -> set[str]:
    """The case-folded words of ``text`` that carry meaning for a lexical overlap score:
    longer than two letters, or non-ASCII (one CJK character is a word)."""
    return {w for w in _WORDS.findall(text.casefold()) if len(w) > 2 or not w.isascii()}


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _word_tokens(word: str) -> int:
    if len(word) == 1 and _CJK_RE.match(word):
        return 1
    return max(1, (len(word) + 3) // 4)


def _has_cjk(text: str) -> bool:
    # isascii() is a flag read on the string, a hundredth of the regex scan: most text is ASCII.
    return not text.isascii() and _CJK_RE.search(text) is not None


def approx_tokens(text: str) -> int:
    """The approximate token count described in the module docstring."""
    if not _has_cjk(text):
        # Without CJK a word is a run of non-whitespace, which str.split() finds as _WORD_RE
        # does (both split on Unicode whitespace), twice as fast as counting matches.
        return sum([(len(w) + 3) >> 2 for w in text.split()])
    return len(_TOKEN_RE.findall(text))


def fts_text(text: str) -> str:
    """The text given to FTS5: CJK characters spaced apart so unicode61 sees each as a token."""
    if not _has_cjk(text):
        return text
    return _CJK_RE.sub(lambda m: f" {m.group()} ", text)


# Unit and Chunk are NamedTuples, not frozen dataclasses: as immutable, and made five times
# faster (a frozen dataclass's __init__ sets each field through object.__setattr__), which was a
# twentieth of a keyword-only index build with TranscriptEntry (bench/README.md, "Scale").
class Unit(NamedTuple):
    """A whole message, or one segment of a long one."""

    line: int
    offset: int
    seg: int          # 0 for the message's first (or only) segment
    prefix: str       # "role [ts]: "
    body: str
    tokens: int
    ts: str | None


class Chunk(NamedTuple):
    """One chunk: its rendered text, where in the transcript it starts and ends, its times and
    the sha256 of its text."""

    idx: int
    content: str
    line_start: int
    line_end: int
    seg_start: int
    byte_start: int
    start_ts: str | None
    end_ts: str | None
    content_hash: str


def _prefix(entry: TranscriptEntry) -> str:
    msg = entry.message
    who = msg.name or msg.role
    return f"{who} [{msg.ts}]: " if msg.ts else f"{who}: "


def _segments(text: str, limit: int) -> list[str]:
    """Cut ``text`` at word boundaries into pieces of at most ``limit`` approximate tokens."""
    pieces: list[str] = []
    start = 0       # start of the current piece in text
    used = 0
    for m in _WORD_RE.finditer(text):
        cost = _word_tokens(m.group())
        if cost > limit:  # one enormous word: flush, then cut it by characters
            if used:
                pieces.append(text[start:m.start()].strip())
            step = limit * 4
            word = m.group()
            for i in range(0, len(word), step):
                pieces.append(word[i:i + step])
            start, used = m.end(), 0
            continue
        if used + cost > limit and used:
            pieces.append(text[start:m.start()].strip())
            start, used = m.start(), 0
        used += cost
    tail = text[start:].strip()
    if tail:
        pieces.append(tail)
    return [p for p in pieces if p]


def _with_files(content: str, files: object) -> str:
    """A message's text and its attachments' text (``attachments[i].text`` on the line, written
    by chat.send), each under a ``[file: name]`` header so a hit names its source."""
    parts = [content] if content else []
    for f in files if isinstance(files, list) else ():
        if isinstance(f, dict) and isinstance(f.get("text"), str) and f["text"].strip():
            parts.append(f"[file: {f.get('name')}] {f['text'].strip()}")
    return "\n\n".join(parts)


def message_units(entry: TranscriptEntry, chunk_tokens: int, overlap_tokens: int) -> list[Unit]:
    text = _with_files(entry.message.content.strip(), entry.message.extra.get("attachments"))
    if not text:
        return []
    prefix = _prefix(entry)
    ts = entry.message.ts
    head = approx_tokens(prefix)
    whole = head + approx_tokens(text)
    if whole <= chunk_tokens:
        return [Unit(entry.line, entry.offset, 0, prefix, text, whole, ts)]
    limit = max(_MIN_SEGMENT_TOKENS, overlap_tokens)
    return [
        Unit(entry.line, entry.offset, i, prefix, body, head + approx_tokens(body), ts)
        for i, body in enumerate(_segments(text, limit))
    ]


def _render(units: Sequence[Unit]) -> str:
    lines: list[str] = []
    current_line = -1
    for unit in units:
        if unit.line == current_line:
            lines[-1] += " " + unit.body
            continue
        current_line = unit.line
        cont = CONTINUED if unit.seg > 0 else ""
        lines.append(unit.prefix + cont + unit.body)
    return "\n".join(lines)


def _make_chunk(units: Sequence[Unit], idx: int) -> Chunk:
    content = _render(units)
    stamps = [u.ts for u in units if u.ts]
    return Chunk(
        idx=idx,
        content=content,
        line_start=units[0].line,
        line_end=units[-1].line,
        seg_start=units[0].seg,
        byte_start=units[0].offset,
        start_ts=min(stamps) if stamps else None,
        end_ts=max(stamps) if stamps else None,
        content_hash=sha256_text(content),
    )


def pack_units(units: Sequence[Unit], chunk_tokens: int, overlap_tokens: int,
               first_idx: int = 0) -> list[Chunk]:
    """Greedy packing with overlap, as the module docstring states."""
    chunks: list[Chunk] = []
    n = len(units)
    start = 0
    while start < n:
        end, total = start, 0
        while end < n and (end == start or total + units[end].tokens <= chunk_tokens):
            total += units[end].tokens
            end += 1
        chunks.append(_make_chunk(units[start:end], first_idx + len(chunks)))
        if end >= n:
            break
        nxt, carried = end, 0
        while nxt - 1 > start:
            cost = units[nxt - 1].tokens
            if carried + cost > overlap_tokens or carried + cost + units[end].tokens > chunk_tokens:
                break
            carried += cost
            nxt -= 1
        start = nxt
    return chunks


def chunk_messages(
    messages: Iterable[TranscriptEntry],
    chunk_tokens: int,
    overlap_tokens: int,
    *,
    first_idx: int = 0,
    skip_segments: int = 0,
) -> list[Chunk]:
    """Chunks of ``messages``; ``skip_segments`` drops leading segments of the first message
    (used when re-packing from a chunk that began inside a long message)."""
    units: list[Unit] = []
    for msg in messages:
        units.extend(message_units(msg, chunk_tokens, overlap_tokens))
    if skip_segments and units:
        first_line = units[0].line
        units = [u for u in units if not (u.line == first_line and u.seg < skip_segments)]
    return pack_units(units, chunk_tokens, overlap_tokens, first_idx)


def visible_entries(entries: Sequence[TranscriptEntry], *,
                    new_from: int) -> tuple[list[TranscriptEntry], bool]:
    """The entries a reader of history sees (messages superseded by ``chat.edit`` or
    ``chat.regenerate`` left out, the rule of :func:`sessions.visible_messages`), and whether
    the transcript must be re-chunked from its start instead.

    ``entries`` is a suffix of a transcript (an indexer's tail read), so hiding within it is
    exact for the lines the suffix holds. But the chunks before the tail overlap it (a chunk
    carries the head of the next), and the tail's first chunk may begin inside the very message
    a new line hides, so a *new* superseding entry (``offset >= new_from``: not indexed before)
    asks for the whole transcript: the second value is True. Edits and regenerations are rare
    next to appends, the unchanged chunks stay and their vectors come from the cache. An old
    superseding entry was applied when it was new, so it never asks again.
    """
    whole = any(e.offset >= new_from and replaced_id(e.message) is not None for e in entries)
    shown_ids = {m.id for m in visible_messages([e.message for e in entries])}
    return [e for e in entries if e.message.id in shown_ids], whole


def iso_to_ms(ts: str | None) -> int | None:
    """ISO-8601 (``Z`` or offset; naive means UTC) → epoch milliseconds, None if unparsable.

    How chunk times are stored (``start_ms``/``end_ms``) and how search filters read dates, so
    the two always agree.
    """
    if not ts:
        return None
    try:
        parsed = datetime.fromisoformat(ts)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)
