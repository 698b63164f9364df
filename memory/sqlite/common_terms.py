"""Which words of a query are too common for the keyword leg to match on, in a large index.

FTS5 scores every row that matches any term of an ``OR`` query before it can sort and cut
to the leg's candidates, so one word found in a tenth of a million chunks makes the leg score
a hundred thousand rows: at 1M chunks such queries took ~0.5–0.9 s (docs/scaling.md) while the
rest took tens of milliseconds. BM25 weighs a term by ``ln((N − df + ½) / (df + ½))``; a word
in 5% of the chunks weighs about 2.9 against 7–11 for the words that find a conversation, so
leaving it out of the ``MATCH`` changes the ranking little and the cost a lot.

A term is *common* when it matches at least ``max(keyword_common_share · N,
keyword_common_min_chunks)`` of the database's N chunks (every user's: FTS5 keeps no per-user
counts). An index no larger than that floor looks nothing up and keeps every term. The count
for a term stops at the threshold (a ``LIMIT`` inside the count), so asking costs at most that
many row visits, once: answers are kept per open index (state of the service's
:class:`~memory.sqlite.live.LiveIndex`) for ``ttl_s``, and N with them. A
query made only of common terms keeps them all.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence

import apsw

__all__ = ["CommonTerms"]

_COUNT_SQL = "SELECT count(*) FROM (SELECT rowid FROM chunks_fts WHERE chunks_fts MATCH ? LIMIT ?)"
# FTS5 keeps its row count as the first varint of its "averages" record (rowid 1 of the _data
# table): one page read, where count(*) over a million chunks reads the whole table.
_FTS_ROWS_SQL = "SELECT block FROM chunks_fts_data WHERE id = 1"
_CHUNKS_SQL = "SELECT count(*) FROM chunks"
_MAX_ENTRIES = 20_000


class CommonTerms:
    """Per database file: the chunk count and, per term, whether it is common (see the module)."""

    def __init__(self, ttl_s: float = 600.0) -> None:
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        # (when counted, N)
        self._chunks: tuple[float, int] | None = None
        # (when, limit, common)
        self._terms: OrderedDict[str, tuple[float, int, bool]] = OrderedDict()

    def threshold(self, db: apsw.Connection, share: float, min_chunks: int,
                  now: float) -> int | None:
        """Matches from which a term is common; None while the index is too small to bother."""
        if share <= 0:
            return None
        with self._lock:
            cached = self._chunks
        if cached is None or now - cached[0] > self.ttl_s:
            cached = (now, _chunk_count(db))
            with self._lock:
                self._chunks = cached
        limit = max(min_chunks, int(share * cached[1]))
        return limit if cached[1] > limit else None

    def keep(self, db: apsw.Connection, terms: Sequence[str], share: float,
             min_chunks: int) -> list[str]:
        """``terms`` (quoted FTS5 phrases) without the common ones, or all of them when every
        one is common or the index is small."""
        if len(terms) < 2:
            return list(terms)
        now = time.monotonic()
        limit = self.threshold(db, share, min_chunks, now)
        if limit is None:
            return list(terms)
        kept = [t for t in terms if not self._is_common(db, t, limit, now)]
        return kept or list(terms)

    def _is_common(self, db: apsw.Connection, term: str, limit: int, now: float) -> bool:
        with self._lock:
            entry = self._terms.get(term)
        # A cached answer holds while it is fresh and was asked against the same threshold.
        if entry is not None and now - entry[0] <= self.ttl_s and entry[1] == limit:
            return entry[2]
        ((matched,),) = db.execute(_COUNT_SQL, (term, limit)).fetchall()
        common = isinstance(matched, int) and matched >= limit
        with self._lock:
            self._terms[term] = (now, limit, common)
            self._terms.move_to_end(term)
            while len(self._terms) > _MAX_ENTRIES:
                self._terms.popitem(last=False)
        return common


def _chunk_count(db: apsw.Connection) -> int:
    row = db.execute(_FTS_ROWS_SQL).fetchone()
    block = row[0] if row is not None else None
    if isinstance(block, bytes) and block:
        value = 0
        for i, byte in enumerate(block[:9]):  # SQLite's varint: 7 bits a byte, the 9th whole
            if i == 8:
                return (value << 8) | byte
            value = (value << 7) | (byte & 0x7F)
            if byte < 0x80:
                return value
    ((n,),) = db.execute(_CHUNKS_SQL).fetchall()
    return n if isinstance(n, int) else 0
