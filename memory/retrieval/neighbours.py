"""Widening recalled excerpts by the message before and after them, in what the budget left.

A hit is often half of an exchange: the user's question without the answer that followed, or
the assistant's reply without what it answered. Once :func:`memory.retrieval.recall.for_prompt`
has placed the excerpts (best first, within ``recall_budget_tokens``), :func:`widen` spends the
tokens left on their neighbours: for each excerpt in rank order, the message on the line just
before it, then the one just after, each only if it fits whole. Hits are never displaced, so
what reaches the prompt can only grow; a failed read leaves the excerpts as they were.

The neighbour's text comes from the index's own chunks (never from the transcript file), so a
range ``memory.forget`` or retention removed cannot come back through widening. A chunk's
content is its messages rendered as ``who [ts]: text`` (:mod:`memory.chunking`; a message's
text may hold newlines), so it is split into messages at each line that opens with such a
prefix. Its first message is line ``line_start``, its last ``line_end``, and one in between is
numbered by counting, used only when the chunk holds one message per line of its span (an
empty message renders nothing). Only whole messages are added: a message split across chunks
(a segment starting at ``seg_start > 0``) is never a neighbour, nor widened past.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import structlog

from memory.chunking import CONTINUED, approx_tokens
from memory.config import MemoryConfig
from memory.errors import MemoryIndexError
from memory.retrieval.recall import CUT_MARK, merge_overlapping
from memory.retrieval.request import SearchHit

__all__ = ["AROUND_SQL", "OPENS", "ChunkSpan", "message_at", "message_ts", "messages", "spans",
           "widen"]

log = structlog.get_logger("memory.recall")

# "who [2026-11-27T10:00:00.000Z]: " at the start of a line opens a message (``_prefix`` in
# memory.chunking). A message's own line that looks like this would split it wrongly; the
# count check below then refuses the chunk, or the text is still the message's own.
OPENS = re.compile(r"^[^\n\[\]]{1,80} \[(\d{4}-\d\d-\d\dT[^\]\n]*)\]: ", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class ChunkSpan:
    line_start: int
    line_end: int
    seg_start: int
    content: str


FetchAround = Callable[[SearchHit], Awaitable[list[ChunkSpan]]]

# Every chunk of the hit's session that holds a line from the one before it to the one after
# (both backends: placeholders rewritten for psycopg; the (user, session_key) index serves it).
AROUND_SQL = ("SELECT line_start, line_end, seg_start, content FROM {table} WHERE {user} = ? "
              "AND session_key = ? AND line_end >= ? AND line_start <= ? "
              "ORDER BY line_start, seg_start")


def spans(rows: Sequence[Sequence[Any]]) -> list[ChunkSpan]:
    return [ChunkSpan(int(r[0]), int(r[1]), int(r[2]), str(r[3])) for r in rows]


def messages(content: str) -> list[str] | None:
    """``content`` split into its rendered messages; None when it does not open with one."""
    starts = [m.start() for m in OPENS.finditer(content)]
    if not starts or starts[0] != 0:
        return None
    return [content[a:b].rstrip("\n")
            for a, b in zip(starts, [*starts[1:], len(content)], strict=True)]


def _continued(message: str) -> bool:
    opened = OPENS.match(message)
    return opened is not None and message[opened.end():].startswith(CONTINUED)


def _split(chunks: list[ChunkSpan], line: int) -> bool:
    """Whether the message on ``line`` was cut into segments across chunks."""
    return any(c.line_start == line and c.seg_start > 0 for c in chunks)


def message_at(chunks: list[ChunkSpan], line: int) -> str | None:
    """The whole rendered message on transcript ``line``, from any chunk that can say which of
    its messages that is; None when none can, or the message was split."""
    if _split(chunks, line):
        return None
    for chunk in chunks:
        if not chunk.line_start <= line <= chunk.line_end:
            continue
        found = messages(chunk.content)
        if found is None:
            continue
        if chunk.line_start == line:
            i = 0
        elif chunk.line_end == line:
            i = len(found) - 1
        elif len(found) == chunk.line_end - chunk.line_start + 1:
            i = line - chunk.line_start
        else:
            continue  # an empty message in the span: the ones between cannot be numbered
        return None if _continued(found[i]) else found[i]
    return None


def message_ts(message: str) -> str | None:
    """The time in a rendered message's ``who [ts]: `` opening, or None."""
    opened = OPENS.match(message)
    return opened.group(1) if opened else None


def _held(excerpts: list[SearchHit], i: int, line: int) -> bool:
    """Whether an excerpt other than the ``i``-th holds ``line`` of its session (not paid twice)."""
    key = excerpts[i].session_key
    return any(j != i and o.session_key == key and o.line_start <= line <= o.line_end
               for j, o in enumerate(excerpts))


def _with(hit: SearchHit, message: str, line: int, *, before: bool) -> SearchHit:
    ts = message_ts(message)
    stamps = [t for t in (hit.start_ts, hit.end_ts, ts) if t]
    content = f"{message}\n{hit.content}" if before else f"{hit.content}\n{message}"
    return replace(hit, content=content, line_start=min(hit.line_start, line),
                   line_end=max(hit.line_end, line), start_ts=min(stamps, default=None),
                   end_ts=max(stamps, default=None))


async def widen(excerpts: list[SearchHit], config: MemoryConfig,
                around: FetchAround) -> list[SearchHit]:
    """``excerpts`` (placed by ``for_prompt``) with their neighbouring messages added, best
    excerpt first, as far as the tokens they left of ``recall_budget_tokens`` allow; unchanged
    when ``recall_neighbours`` is off or the index cannot be read."""
    if not config.recall_neighbours:
        return excerpts
    left = config.recall_budget_tokens - sum(approx_tokens(h.content) for h in excerpts)
    out = list(excerpts)
    for i, hit in enumerate(out):
        if left <= 0:
            break
        if hit.content.endswith(CUT_MARK):
            continue  # the budget cut this one: nothing fits after it
        try:
            chunks = await around(hit)
        except MemoryIndexError as exc:  # optional: the excerpts found stand as they are
            log.warning("memory.recall.widen_failed", error=str(exc))
            return merge_overlapping(out)
        # A side whose own edge message was split is not widened: its rest may be missing.
        for line, before in ((hit.line_start - 1, True), (hit.line_end + 1, False)):
            edge = hit.line_start if before else hit.line_end
            if _split(chunks, edge) or _held(out, i, line):
                continue
            message = message_at(chunks, line)
            if message is not None and (cost := approx_tokens(message)) <= left:
                hit = _with(hit, message, line, before=before)
                left -= cost
        out[i] = hit
    # A neighbour can make two excerpts of one session touch: they become one, as for_prompt does.
    return merge_overlapping(out)
