"""Hybrid search: an FTS5 BM25 leg and a sqlite-vec KNN leg, fused in
:mod:`memory.retrieval.fusion`.

Each leg is one statement returning its best ``candidates`` chunk ids with the leg's own
score (negated BM25; cosine similarity), best first; both run in one read transaction, so
they see the same snapshot. The fusion keeps every chunk either leg found (nothing is dropped
by a score threshold) and the top ``k`` are read back from ``chunks``. A single-leg mode runs
one leg and fuses it alone, so every mode reports ranks the same way.

Filters are fixed SQL fragments with named parameters, chosen by which filters are set; no
user value is ever formatted into SQL or into the FTS5 ``MATCH`` expression:

* keyword leg: ``chunks.user = :user`` (+ session / time) joined to the FTS rows; when every
  chunk is the searching user's and no session or time filter narrows the search, the FTS
  rows are ranked alone and only the best are looked up (an excluded session is checked on
  those, with the join as the fallback when it leaves too few);
* vector leg: a pre-filter over the sign bits finds a pool of candidates with every filter
  applied before the pool is cut — :mod:`memory.sqlite.index.knn`'s in-memory Hamming scan of the
  user's partition (numpy), or else sqlite-vec's KNN, where ``user`` is the vec0 *partition key* and
  session/time are vec0 *metadata columns* — and the pool is re-ranked by exact cosine over the
  cached int8 vectors. While the vectors are rebuilt for a new embedder, the service may pass the
  *previous* identity's vectors: the leg then runs over that model's cached vectors instead
  (:mod:`memory.sqlite.interim`, same pre-filter and re-rank), never over a mix.

Time filters: ``after`` keeps chunks whose last message is at or after it, ``before`` those
whose first message is before it (chunks overlapping the range).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Literal

import apsw

from memory.config import MemoryConfig
from memory.quantize import quantize_int8, vector_from_blob
from memory.retrieval.fusion import Fused, fuse, with_recency
from memory.retrieval.neighbours import AROUND_SQL, ChunkSpan, spans
from memory.retrieval.request import SearchHit, SearchRequest, fts_terms
from memory.sqlite import interim
from memory.sqlite.common_terms import CommonTerms
from memory.sqlite.index import knn

__all__ = ["HybridSearch", "around_sqlite", "build_sql", "keyword_match"]

# Every chunk of the database is one user's (a personal daemon): the FTS rows are ranked alone
# and only the best few are looked up in ``chunks``. The join below reads the ``chunks`` row of
# every match to check its owner — tens of thousands of rows for a common word at 1M chunks,
# most of the leg's time and, through the read mapping, gigabytes of resident file pages.
_OWNERS_SQL = "SELECT (SELECT min(user) FROM chunks), (SELECT max(user) FROM chunks)"
_KEYWORD_RANKED_SQL = """
SELECT rowid, -bm25(chunks_fts)
FROM chunks_fts
WHERE chunks_fts MATCH :fts_query
ORDER BY bm25(chunks_fts), rowid
LIMIT :ranked
"""
_KEYWORD_EXCLUDED_SQL = """
SELECT chunks.id FROM json_each(:ids) AS ids CROSS JOIN chunks ON chunks.id = ids.value
WHERE {excluded}
"""
# What each exclusion leaves out of the ranked path's list (ShownHistory: the prompt's window).
_EXCLUDED = {
    "exclude_session_key": "chunks.session_key = :exclude_session_key",
    "shown_since_ms": "(chunks.session_key = :shown_session_key "
                      "AND (chunks.start_ms >= :shown_since_ms OR chunks.start_ms IS NULL))",
}
# Filters the ranked path cannot apply after the cut without risking a short list: a session or
# a time window may hold few of the best matches, so those searches take the join.
_NARROWING = ("session_key", "after_ms", "before_ms")

_KEYWORD_SQL = """
SELECT chunks.id, -bm25(chunks_fts)
FROM chunks_fts
JOIN chunks ON chunks.id = chunks_fts.rowid
WHERE chunks_fts MATCH :fts_query
  AND chunks.user = :user{filters}
ORDER BY bm25(chunks_fts), chunks.id
LIMIT :candidates
"""

# The vector leg, two steps: a pre-filter finds a wide pool of candidates by the sign bits
# (Hamming distance), then the pool is re-ranked by exact cosine against each chunk's cached
# int8 vector (found through chunks.vector_hash, or content_hash when the text sent was the
# chunk's) and cut to the leg's candidates. The score is the cosine similarity.
#
# With numpy (>= 2.0) the pre-filter is memory.sqlite.index.knn's in-memory scan of the user's sign
# bits and the pool comes in as :pool (a JSON array of chunk ids); the re-rank applies the filters
# again on chunks, so a stale in-memory row can never let a filtered-out chunk through. CROSS JOIN
# pins the join order: the pool drives, each row one primary-key lookup per table (left to itself
# the planner may scan the user's chunks and probe the pool for each).
_RERANK_SQL = """
SELECT chunks.id,
       1.0 - vec_distance_cosine(vec_int8(embedding_cache.vector), vec_int8(:query_int8))
           AS similarity
FROM json_each(:pool) AS pool
CROSS JOIN chunks ON chunks.id = pool.value
CROSS JOIN embedding_cache
  ON embedding_cache.provider = :provider
 AND embedding_cache.model = :model
 AND embedding_cache.endpoint_hash = :endpoint_hash
 AND embedding_cache.content_hash = coalesce(chunks.vector_hash, chunks.content_hash)
WHERE chunks.user = :user
  AND chunks.embedded = 1{filters}
ORDER BY similarity DESC, chunks.id
LIMIT :candidates
"""

# Without numpy (or for an int8 chunks_vec) sqlite-vec's own KNN finds the pool, with the
# filters applied inside the KNN (user is the partition key, session/time metadata columns).
_VECTOR_SQL = """
WITH vec_pool AS (
    SELECT chunk_id
    FROM chunks_vec
    WHERE embedding MATCH {knn_query}
      AND k = :vec_pool
      AND user = :user{filters}
)
SELECT vec_pool.chunk_id,
       1.0 - vec_distance_cosine(vec_int8(embedding_cache.vector), vec_int8(:query_int8))
           AS similarity
FROM vec_pool
JOIN chunks ON chunks.id = vec_pool.chunk_id
JOIN embedding_cache
  ON embedding_cache.provider = :provider
 AND embedding_cache.model = :model
 AND embedding_cache.endpoint_hash = :endpoint_hash
 AND embedding_cache.content_hash = coalesce(chunks.vector_hash, chunks.content_hash)
WHERE true{outer}
ORDER BY similarity DESC, vec_pool.chunk_id
LIMIT :candidates
"""

_KNN_QUERY = {"bit": "vec_quantize_binary(vec_int8(:query_int8))", "int8": "vec_int8(:query_int8)"}

_SESSION_IDS_SQL = "SELECT id FROM chunks WHERE user = ? AND session_key = ? AND embedded = 1"
_SHOWN_IDS_SQL = _SESSION_IDS_SQL + " AND (start_ms >= ? OR start_ms IS NULL)"


def _session_chunk_ids(db: apsw.Connection, user: str, session_key: str | None) -> list[int] | None:
    """A session filter as the in-memory scan applies it: the session's chunk ids (its index)."""
    if session_key is None:
        return None
    return [int(cid) for (cid,) in db.execute(_SESSION_IDS_SQL, (user, session_key))]


def _excluded_ids(db: apsw.Connection, request: SearchRequest) -> list[int] | None:
    """The chunk ids the in-memory scan leaves out: an excluded session's, and the chunks of the
    prompt's history window (``ShownHistory``)."""
    ids = _session_chunk_ids(db, request.user, request.exclude_session_key)
    if request.shown_session_key is None or request.shown_since_ms is None:
        return ids
    shown = [int(cid) for (cid,) in db.execute(
        _SHOWN_IDS_SQL, (request.user, request.shown_session_key, request.shown_since_ms))]
    return shown if ids is None else ids + shown

# The in-memory pre-filter keeps RERANK_SCAN chunks by Hamming distance, orders them by the
# query's dot product with their signs, and hands the best RERANK_POOL to the exact re-rank,
# whose cost is per row (two b-tree lookups: ~20 µs a row on the loaded 2-core bench machine).
# At 100k synthetic clustered vectors the vector leg's recall@10 against an exact float scan
# is 0.67 with a Hamming pool of 100 straight to the re-rank; bench/README.md ("Vector
# storage") has the table these two were picked from.
RERANK_SCAN = 1000
RERANK_POOL = 300
# Past 250k chunks in a partition the scan grows with it (0.4% of the rows the filters leave):
# at 1M a fixed 1,000 held vector recall@10 to 0.935 (docs/scaling.md).
RERANK_SCAN_SHARE = 0.004
# The same for sqlite-vec's KNN (no numpy), whose cost grows ~0.11 ms per unit of k at 100k
# rows: 100 keeps the hybrid p50 near 15 ms at the price of that 0.67.
RERANK_POOL_FACTOR = 2
RERANK_POOL_MIN = 100
_VEC0_MAX_K = 4096

_ROWS_SQL = """
SELECT id, session_key, content, line_start, line_end, start_ts, end_ts
FROM chunks WHERE id IN ({marks})
"""

# When each fused chunk was said (its last message), for the recency term of a hybrid search.
_SAID_SQL = "SELECT id, COALESCE(end_ms, start_ms) FROM chunks WHERE id IN ({marks})"

_overlap_lock = threading.Lock()
_overlap: ThreadPoolExecutor | None = None


def _overlap_pool() -> ThreadPoolExecutor:
    """Threads for the vector leg's scan beside the keyword leg (created on first use). Two,
    so that two readers' searches (the service's reader pool) overlap as well; the scans
    themselves take the sign-bit index's lock one at a time."""
    global _overlap
    with _overlap_lock:
        if _overlap is None:
            _overlap = ThreadPoolExecutor(max_workers=2, thread_name_prefix="recalld-scan")
        return _overlap

# Fixed fragments, picked by which filters are set: (keyword leg, vector leg).
_FILTERS = {
    "session_key": ("\n  AND chunks.session_key = :session_key",
                    "\n      AND session_key = :session_key"),
    "exclude_session_key": ("\n  AND chunks.session_key != :exclude_session_key",
                            "\n      AND session_key != :exclude_session_key"),
    "after_ms": ("\n  AND chunks.end_ms >= :after_ms", "\n      AND end_ms >= :after_ms"),
    "before_ms": ("\n  AND chunks.start_ms < :before_ms", "\n      AND start_ms < :before_ms"),
    # ShownHistory: binds both names; sqlite-vec's KNN takes no OR, so its leg applies it after
    # the pool (``_VECTOR_SQL``'s outer filter), and the key alone adds no fragment.
    "shown_session_key": ("", ""),
    "shown_since_ms": ("\n  AND (chunks.session_key != :shown_session_key OR chunks.start_ms < "
                       ":shown_since_ms)",
                       ""),
}


def build_sql(request: SearchRequest, *, leg: Literal["keyword", "vector"],
              vector_format: str = "bit") -> tuple[str, list[str]]:
    """One leg's statement for these filters, and the names of the filters it binds."""
    active = [name for name in _FILTERS if getattr(request, name) is not None]
    if leg == "keyword":
        return _KEYWORD_SQL.format(filters="".join(_FILTERS[n][0] for n in active)), active
    return (_VECTOR_SQL.format(filters="".join(_FILTERS[n][1] for n in active),
                               outer=(_FILTERS["shown_since_ms"][0] if "shown_since_ms" in active
                                      else ""),
                               knn_query=_KNN_QUERY[vector_format]), active)


def keyword_match(db: apsw.Connection, query: str, config: MemoryConfig,
                  common: CommonTerms | None = None) -> str:
    """The keyword leg's ``MATCH`` expression for ``query``: its quoted terms OR-ed, words
    common at this database's size left out (``""`` when no term is left). ``common``: the
    index's counts of common words (None: counted afresh)."""
    terms = fts_terms(query, config.max_query_terms)
    if terms:
        terms = (common or CommonTerms()).keep(
            db, terms, config.keyword_common_share, config.keyword_common_min_chunks)
    return " OR ".join(terms)


class HybridSearch:
    """Runs a :class:`SearchRequest` on a read connection (blocking; call it off the loop)."""

    def __init__(self, db: apsw.Connection, config: MemoryConfig, *,
                 previous: interim.PreviousVectors | None = None,
                 signs: knn.SignIndex | None = None, common: CommonTerms | None = None) -> None:
        """``previous``: run the vector leg over a previous identity's cached vectors (a
        rebuild is under way; the query vector must come from that identity's model).
        ``signs`` and ``common``: the index's in-memory sign bits and common-word counts (the
        service's :class:`~memory.sqlite.live.LiveIndex`); None loads them for this search alone."""
        self.db = db
        self.config = config
        self.previous = previous
        self.signs = signs if signs is not None else knn.SignIndex()
        self.common = common if common is not None else CommonTerms()

    def search(self, request: SearchRequest, *, query_vector: bytes | None,
               keyword: bool = True) -> list[SearchHit]:
        """Hits for ``request``; the vector leg runs when ``query_vector`` is given."""
        windowed = request.within_window()
        with self.db:  # one read transaction: every leg and the rows see the same snapshot
            if windowed is None:
                fused = self._fused(request, query_vector, keyword)
            else:
                # A time phrase ("last week", "in May 2023"): what was said in its window comes
                # first, the rest of the ranking after it, so a wrong or too-narrow window
                # costs rank, never recall. The keyword legs leave the phrase's words out.
                inside = self._fused(windowed, query_vector, keyword)
                seen = {f.chunk_id for f in inside}
                rest = self._fused(replace(request, query=windowed.query), query_vector, keyword)
                fused = inside + [f for f in rest if f.chunk_id not in seen]
            hits = self._hits(fused[:request.k])
        return hits

    def _fused(self, request: SearchRequest, query_vector: bytes | None,
               keyword: bool) -> list[Fused]:
        # The vector leg starts first: on a large partition its scan runs on another thread
        # while this one runs the keyword leg's SQL, and the two meet before the fusion.
        finish_vector = (self._start_vector_leg(request, query_vector) if query_vector is not None
                         else None)
        try:
            match = (keyword_match(self.db, request.query, self.config, self.common) if keyword
                     else "")
            keyword_leg = self._keyword_leg(request, match) if match else []
        finally:
            vector_leg = finish_vector() if finish_vector is not None else []
        fused = fuse(keyword_leg, vector_leg, self.config)
        if not request.recency or request.mode != "hybrid" or request.now_ms is None or not fused:
            return fused  # memory.search, and the single-leg modes, rank by relevance alone
        ids = [f.chunk_id for f in fused]
        said = dict(self.db.execute(_SAID_SQL.format(marks=",".join("?" * len(ids))), ids))
        return with_recency(fused, said, request.now_ms, self.config)

    def _keyword_leg(self, request: SearchRequest, match: str) -> list[tuple[int, float]]:
        if not any(getattr(request, name) is not None for name in _NARROWING):
            first, last = self.db.execute(_OWNERS_SQL).fetchone() or (None, None)
            if first == last:  # one owner, or none
                return self._ranked_keyword_leg(request, match) if first == request.user else []
        return self._joined_keyword_leg(request, match)

    def _joined_keyword_leg(self, request: SearchRequest, match: str) -> list[tuple[int, float]]:
        sql, active = build_sql(request, leg="keyword")
        params: dict[str, Any] = {"user": request.user, "candidates": self.config.candidates,
                                  "fts_query": match}
        params.update((name, getattr(request, name)) for name in active)
        return [(int(cid), float(score)) for cid, score in self.db.execute(sql, params)]

    def _ranked_keyword_leg(self, request: SearchRequest, match: str) -> list[tuple[int, float]]:
        """The keyword leg when the database holds only this user's chunks: the same list as the
        join, from the FTS ranking alone. An excluded session (the chat's own) can hold many of
        the best matches, so twice the candidates are ranked; if the exclusion leaves fewer than
        ``candidates`` of a full ranking, the join computes the list instead."""
        candidates = self.config.candidates
        exclusions = [name for name in _EXCLUDED if getattr(request, name) is not None]
        ranked = 2 * candidates if exclusions else candidates
        rows = [(int(cid), float(score)) for cid, score in self.db.execute(
            _KEYWORD_RANKED_SQL, {"fts_query": match, "ranked": ranked})]
        if not exclusions:
            return rows
        sql = _KEYWORD_EXCLUDED_SQL.format(
            excluded=" OR ".join(_EXCLUDED[name] for name in exclusions))
        excluded = {int(cid) for (cid,) in self.db.execute(sql, {
            "ids": json.dumps([cid for cid, _ in rows]),
            "exclude_session_key": request.exclude_session_key,
            "shown_session_key": request.shown_session_key,
            "shown_since_ms": request.shown_since_ms})}
        kept = [row for row in rows if row[0] not in excluded]
        if len(kept) >= candidates or len(rows) < ranked:
            return kept[:candidates]
        return self._joined_keyword_leg(request, match)

    def _start_vector_leg(self, request: SearchRequest,
                          query_vector: bytes) -> Callable[[], list[tuple[int, float]]]:
        """Begin the vector leg; the returned call finishes it (the exact re-rank in SQL)."""
        if self.previous is not None:
            previous = self.previous
            return lambda: self._previous_vector_leg(request, query_vector, previous)
        meta = dict(self.db.execute("SELECT key, value FROM meta "
                                    "WHERE key IN ('embedder', 'vector_format')"))
        fmt = meta.get("vector_format") or "bit"
        provider, model, endpoint = json.loads(meta.get("embedder") or '["", "", ""]')
        params: dict[str, Any] = {
            "user": request.user, "candidates": self.config.candidates,
            "query_int8": quantize_int8(vector_from_blob(query_vector)),
            "provider": provider, "model": model, "endpoint_hash": endpoint,
        }
        active = [name for name in _FILTERS if getattr(request, name) is not None]
        params.update((name, getattr(request, name)) for name in active)
        if not (fmt == "bit" and knn.HAVE_NUMPY):
            sql, _ = build_sql(request, leg="vector", vector_format=fmt)
            params["vec_pool"] = min(_VEC0_MAX_K, max(RERANK_POOL_MIN,
                                                      RERANK_POOL_FACTOR * self.config.candidates))
            return lambda: self._rows(sql, params)
        filters = knn.Filters(request.after_ms, request.before_ms,
                              _session_chunk_ids(self.db, request.user, request.session_key),
                              _excluded_ids(self.db, request))
        scan = self.signs.prepare(
            self.db, request.user, params["query_int8"], filters,
            scan=RERANK_SCAN, pool=max(RERANK_POOL, self.config.candidates),
            scan_share=RERANK_SCAN_SHARE)
        sql = _RERANK_SQL.format(filters="".join(_FILTERS[n][0] for n in active))
        threshold = self.config.overlap_min_chunks
        pending = _overlap_pool().submit(scan.run) if threshold and scan.rows >= threshold else None

        def finish() -> list[tuple[int, float]]:
            params["pool"] = json.dumps(pending.result() if pending is not None else scan.run())
            return self._rows(sql, params)
        return finish

    def _rows(self, sql: str, params: dict[str, Any]) -> list[tuple[int, float]]:
        return [(int(cid), float(score)) for cid, score in self.db.execute(sql, params)]

    def _previous_vector_leg(self, request: SearchRequest, query_vector: bytes,
                             previous: interim.PreviousVectors) -> list[tuple[int, float]]:
        """The vector leg over ``previous``'s cached vectors (memory.sqlite.interim): the
        same Hamming pre-filter and exact re-rank as the normal leg, pending chunks included."""
        query_int8 = quantize_int8(vector_from_blob(query_vector))
        filters = knn.Filters(request.after_ms, request.before_ms,
                              interim.session_ids(self.db, request.user, request.session_key),
                              interim.session_ids(self.db, request.user,
                                                  request.exclude_session_key))
        pool = previous.nearest(
            self.db, request.user, query_int8, filters,
            scan=RERANK_SCAN, pool=max(RERANK_POOL, self.config.candidates),
            scan_share=RERANK_SCAN_SHARE)
        active = [name for name in _FILTERS if getattr(request, name) is not None]
        params: dict[str, Any] = {"user": request.user, "candidates": self.config.candidates,
                                  "query_int8": query_int8, "pool": json.dumps(pool),
                                  **interim.identity_params(previous.identity)}
        params.update((name, getattr(request, name)) for name in active)
        sql = interim.RESCORE_SQL.format(filters="".join(_FILTERS[n][0] for n in active))
        return [(int(cid), float(score)) for cid, score in self.db.execute(sql, params)]

    def _hits(self, fused: list[Fused]) -> list[SearchHit]:
        if not fused:
            return []
        ids = [f.chunk_id for f in fused]
        rows = {row[0]: row
                for row in self.db.execute(_ROWS_SQL.format(marks=",".join("?" * len(ids))), ids)}
        hits: list[SearchHit] = []
        for f in fused:
            row = rows.get(f.chunk_id)
            if row is None:  # deleted between the legs and this read: a snapshot makes this rare
                continue
            cid, session_key, content, line_start, line_end, start_ts, end_ts = row
            hits.append(SearchHit(cid, session_key, content, f.score, line_start, line_end,
                                  start_ts, end_ts, f.keyword_rank, f.vector_rank, f.similarity))
        return hits


_AROUND_SQLITE = AROUND_SQL.format(table="chunks", user="user")


def around_sqlite(db: apsw.Connection, user: str, hit: SearchHit) -> list[ChunkSpan]:
    """The chunks around ``hit`` in the SQLite index (run on a reader connection)."""
    return spans(db.execute(_AROUND_SQLITE, (user, hit.session_key, hit.line_start - 1,
                                             hit.line_end + 1)).fetchall())
