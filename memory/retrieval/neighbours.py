"""Widening recalled excerpts by the message before and after them, in what the budget left.

A hit is often half of an exchange: the user's question without the answer that followed, or
the assistant's reply without what it answered. Once :func:`memory.retrieval.recall.for_prompt`
has placed the excerpts (best first, within ``recall_budget_tokens``), :func:`widen` spends the
tokens left on their neighbours: for each excerpt in rank order, the message just before it,
then the one just after, each only if it fits whole. Hits are never displaced by neighbours,
so what reaches the prompt can only grow.

The neighbour's text comes from the index's own chunks (never from the transcript file), so a
range ``memory.forget`` removed, or a session the index no longer holds, cannot come back
through widening. A chunk's rendered lines are one per message with text, in line order; its
first line is message ``line_start`` and its last ``line_end``. A neighbour in the middle of an
overlapping chunk is labelled by counting, which holds only when the chunk's lines are
contiguous; where they are not, or the neighbour is not adjacent, the excerpt is not widened.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import apsw

from memory.chunking import approx_tokens
from memory.config import MemoryConfig
from memory.retrieval.recall import merge_overlapping
from memory.retrieval.request import SearchHit

__all__ = ["AROUND_SQL", "Around", "ChunkSpan", "around_sqlite", "widen"]


@dataclass(frozen=True, slots=True)
class ChunkSpan:
    line_start: int
    line_end: int
    content: str


@dataclass(frozen=True, slots=True)
class Around:
    """The chunk starting last before an excerpt's first line, and the one ending first after
    its last line (either may overlap the excerpt)."""
    before: ChunkSpan | None
    after: ChunkSpan | None


FetchAround = Callable[[SearchHit], Awaitable[Around]]

# The two neighbouring chunks of a session (both backends: the placeholders are rewritten for
# psycopg). Both use the (user, session_key) index.
AROUND_SQL = (
    "SELECT line_start, line_end, content FROM {table} WHERE {user} = ? AND session_key = ? "
    "AND line_start < ? ORDER BY line_start DESC, seg_start DESC LIMIT 1",
    "SELECT line_start, line_end, content FROM {table} WHERE {user} = ? AND session_key = ? "
    "AND line_end > ? ORDER BY line_end, line_start LIMIT 1",
)


def _span(row: Sequence[Any] | None) -> ChunkSpan | None:
    return ChunkSpan(int(row[0]), int(row[1]), str(row[2])) if row else None


def around_sqlite(db: apsw.Connection, user: str, hit: SearchHit) -> Around:
    """The chunks around ``hit`` in the SQLite index (run on a reader connection)."""
    before_sql, after_sql = (s.format(table="chunks", user="user") for s in AROUND_SQL)
    before = db.execute(before_sql, (user, hit.session_key, hit.line_start)).fetchone()
    after = db.execute(after_sql, (user, hit.session_key, hit.line_end)).fetchone()
    return Around(_span(before), _span(after))


def _before(hit: SearchHit, chunk: ChunkSpan) -> tuple[int, str] | None:
    """The message just before ``hit`` in ``chunk``: its line and rendered text."""
    have = set(hit.content.split("\n"))
    lines = chunk.content.split("\n")
    new = [i for i, line in enumerate(lines) if line not in have]
    if not new:
        return None
    i = new[-1]
    if i == len(lines) - 1:
        line = chunk.line_end
    elif len(lines) == chunk.line_end - chunk.line_start + 1:
        line = chunk.line_start + i
    else:
        return None  # a gap in the chunk's lines: its middle lines cannot be numbered
    return (line, lines[i]) if hit.line_start - 1 <= line <= hit.line_start else None


def _after(hit: SearchHit, chunk: ChunkSpan) -> tuple[int, str] | None:
    """The message just after ``hit`` in ``chunk``: its line and rendered text."""
    have = set(hit.content.split("\n"))
    lines = chunk.content.split("\n")
    new = [i for i, line in enumerate(lines) if line not in have]
    if not new:
        return None
    i = new[0]
    if i == 0:
        line = chunk.line_start
    elif len(lines) == chunk.line_end - chunk.line_start + 1:
        line = chunk.line_start + i
    else:
        return None
    return (line, lines[i]) if hit.line_end <= line <= hit.line_end + 1 else None


def _held(excerpts: list[SearchHit], i: int, line: int) -> bool:
    """Whether an excerpt other than the ``i``-th holds ``line`` of its session (not paid twice)."""
    key = excerpts[i].session_key
    return any(j != i and o.session_key == key and o.line_start <= line <= o.line_end
               for j, o in enumerate(excerpts))


async def widen(excerpts: list[SearchHit], config: MemoryConfig, around: FetchAround) -> list[SearchHit]:
    """``excerpts`` (placed by ``for_prompt``) with their neighbouring messages added, best
    excerpt first, as far as the tokens they left of ``recall_budget_tokens`` allow; unchanged
    when ``recall_neighbours`` is off."""
    if not config.recall_neighbours:
        return excerpts
    left = config.recall_budget_tokens - sum(approx_tokens(h.content) for h in excerpts)
    out = list(excerpts)
    for i, hit in enumerate(out):
        if left <= 0:
            break
        if hit.content.endswith(" …"):
            continue  # the budget cut this one: nothing fits after it
        found = await around(hit)
        before = _before(hit, found.before) if found.before else None
        if before is not None and not _held(out, i, before[0]) and (cost := approx_tokens(before[1])) <= left:
            hit = replace(hit, content=before[1] + "\n" + hit.content, line_start=before[0])
            left -= cost
        after = _after(hit, found.after) if found.after else None
        if after is not None and not _held(out, i, after[0]) and (cost := approx_tokens(after[1])) <= left:
            hit = replace(hit, content=hit.content + "\n" + after[1], line_end=after[0])
            left -= cost
        out[i] = hit
    # A neighbour can make two excerpts of one session touch: they become one, as for_prompt does.
    return merge_overlapping(out)
