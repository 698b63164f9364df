"""Hybrid search on PostgreSQL: both legs and their fusion in one statement.

The statement is three CTEs and a join, each leg returning its best ``candidates`` with its own
score, higher better, exactly as :mod:`memory.sqlite.search` hands them to
:func:`memory.retrieval.fusion.fuse`:

* **keyword** — BM25 as FTS5 computes it (k1 1.2, b 0.75; ``idf = ln((N − df + ½)/(df + ½))``,
  at least 1e-6; N, df and the average length over every user's chunks, as FTS5's are over the
  whole table; N and the length from the few rows of ``recalld_memory_corpus``, which a trigger
  keeps equal to the per-session sums in ``recalld_memory_progress``), read
  from ``recalld_memory_postings`` (lexeme, user, block → the block's chunk ids, tfs and the
  chunks' token counts as arrays, unnested here), an inverted index kept from each chunk's
  ``tsvector`` by triggers. ``ts_rank_cd`` is not used:
  it is not BM25, and it moved the sample's R@10 outside the bar (memory/pg/__init__.py).
* **vector** — cosine similarity over the int8 vectors (:mod:`memory.pg.vectors` for the two
  shapes of the leg; during an embedder change's rebuild, an exact scan of the previous model's
  vectors, ``embedding_previous``).
* **fusion** — :func:`fuse`'s rule in SQL: each leg min-max normalised within the query between
  its best and its ``fusion_depth``-th score (lower ones 0; all 1 when those are equal),
  weighted ``keyword_weight`` / ``1 − keyword_weight`` when both legs returned something and 1
  otherwise, or ``Σ w/(rrf_k + rank)`` when ``fusion = "rrf"``; every chunk either leg found is
  kept; ties by the better leg rank, then chunk id.

Time phrases and recency are applied as :class:`memory.sqlite.search.HybridSearch` does,
over the statement's fused rows, in one ``REPEATABLE READ`` transaction (one snapshot).
Filters are fixed fragments with named parameters; no user value is formatted into SQL (the
only formatted values are the vector width, read from the database, and fragments chosen here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any
from weakref import WeakKeyDictionary

import psycopg
from psycopg import AsyncConnection, IsolationLevel
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from memory.config import MemoryConfig
from memory.errors import MemoryStorageError
from memory.pg.migrations import TS_CONFIG
from memory.pg.vectors import VectorLeg, vector_dims
from memory.quantize import quantize_int8
from memory.retrieval.fusion import Fused, with_recency
from memory.retrieval.neighbours import AROUND_SQL, ChunkSpan, spans
from memory.retrieval.request import SearchHit, SearchRequest, fts_terms

__all__ = ["HNSW_EF_SEARCH", "PgSearch", "ef_search", "set_hnsw_search", "statement_params"]

_FILTERS = {
    "session_key": "\n    AND c.session_key = %(session_key)s",
    "exclude_session_key": "\n    AND c.session_key <> %(exclude_session_key)s",
    "after_ms": "\n    AND c.end_ms >= %(after_ms)s",
    "before_ms": "\n    AND c.start_ms < %(before_ms)s",
    # ShownHistory (binds both names): the chunks of the prompt's history window are left out.
    "shown_session_key": "",
    "shown_since_ms": ("\n    AND (c.session_key <> %(shown_session_key)s"
                       " OR c.start_ms < %(shown_since_ms)s)"),
}

# Common words at scale (memory.sqlite.common_terms, same rule and settings): a term found
# in at least max(keyword_common_share · N, keyword_common_min_chunks) chunks is left out of the
# match while a rarer one remains, when N is above that floor; its count stops at the threshold.
_KEYWORD_LEG = f"""
terms AS (
  SELECT DISTINCT l.lexeme
  FROM unnest(%(words)s::text[]) AS w
  CROSS JOIN LATERAL unnest(to_tsvector('{TS_CONFIG}', w)) AS l),
corpus AS (
  SELECT coalesce(sum(n_chunks), 0)::float8 AS n,
         CASE WHEN sum(n_chunks) > 0 THEN sum(total_len)::float8 / sum(n_chunks)
              ELSE 1.0 END AS avgdl
  FROM recalld_memory_corpus),
common AS (
  SELECT CASE WHEN %(common_share)s > 0 AND (SELECT count(*) FROM terms) >= 2
               AND corpus.n > greatest(%(common_min)s, floor(%(common_share)s * corpus.n))
              THEN greatest(%(common_min)s, floor(%(common_share)s * corpus.n))::bigint
         END AS threshold
  FROM corpus),
judged AS (
  SELECT t.lexeme,
         common.threshold IS NOT NULL AND (
           SELECT coalesce(sum(n), 0) FROM (
             SELECT cardinality(p.chunk_ids) AS n FROM recalld_memory_postings p
             WHERE p.lexeme = t.lexeme LIMIT common.threshold) AS hits) >= common.threshold
           AS is_common
  FROM terms t CROSS JOIN common),
kept AS (
  SELECT lexeme FROM judged
  WHERE NOT is_common OR NOT EXISTS (SELECT 1 FROM judged WHERE NOT is_common)),
idf AS (
  SELECT k.lexeme,
         greatest(ln((corpus.n - d.df + 0.5) / (d.df + 0.5)), 1e-6) AS idf
  FROM kept k
  CROSS JOIN corpus
  CROSS JOIN LATERAL (SELECT coalesce(sum(cardinality(p.chunk_ids)), 0)::float8 AS df
                      FROM recalld_memory_postings p WHERE p.lexeme = k.lexeme) AS d),
kw AS (
  SELECT p.chunk_id AS id,
         sum(idf.idf * (p.tf * 2.2) / (p.tf + 1.2 * (0.25 + 0.75 * p.doc_len / corpus.avgdl)))
           AS score
  FROM idf
  JOIN recalld_memory_postings b ON b.lexeme = idf.lexeme AND b.user_id = %(user)s
  CROSS JOIN unnest(b.chunk_ids, b.tfs, b.doc_lens) AS p(chunk_id, tf, doc_len){{chunk_join}}
  CROSS JOIN corpus
  WHERE true{{filters}}
  GROUP BY p.chunk_id
  ORDER BY score DESC, p.chunk_id
  LIMIT %(candidates)s)"""

# Only a session or time filter, or a phrase, needs the chunk row of each posting.
_CHUNK_JOIN = "\n  JOIN recalld_memory_chunks c ON c.id = p.chunk_id"

# A term of several tokens (a CJK bigram, two characters each indexed on its own: fts_terms) is a
# phrase in FTS5: its characters must be adjacent. The postings hold no positions, so a chunk the
# lexemes found must also match one of the terms as a phrase in its own ``tsv`` (which has them);
# 北京 then no longer finds 東京 through their shared 京. BM25 still sums the lexemes' scores.
_PHRASES = (f"\n    AND c.tsv @@ ANY(ARRAY(SELECT phraseto_tsquery('{TS_CONFIG}', w) "
            "FROM unnest(%(words)s::text[]) AS w))")

_NO_KEYWORD_LEG = "kw AS (SELECT NULL::bigint AS id, NULL::float8 AS score WHERE false)"
_NO_VECTOR_LEG = "vec AS (SELECT NULL::bigint AS id, NULL::float8 AS score WHERE false)"

# HNSW: one ordered index scan (its order may be relaxed by the iterative scan; the leg re-sorts).
_VECTOR_HNSW = """
vec AS (
  SELECT id, score FROM (
    SELECT c.id, 1 - ((c.embedding::halfvec({dims})) <=> %(query)s::halfvec({dims})) AS score
    FROM recalld_memory_chunks c
    WHERE c.user_id = %(user)s AND c.embedding IS NOT NULL{filters}
    ORDER BY (c.embedding::halfvec({dims})) <=> %(query)s::halfvec({dims})
    LIMIT %(candidates)s) AS nearest
  ORDER BY score DESC, id)"""

# SQLite's two steps: the nearest pool by Hamming distance over the sign bits, then exact cosine.
_VECTOR_BIT = """
vec AS (
  SELECT id, 1 - ((embedding::halfvec({dims})) <=> %(query)s::halfvec({dims})) AS score FROM (
    SELECT c.id, c.embedding
    FROM recalld_memory_chunks c
    WHERE c.user_id = %(user)s AND c.embedding IS NOT NULL{filters}
    ORDER BY binary_quantize(c.embedding)::bit({dims})
      <~> binary_quantize(%(query)s::halfvec({dims}))::bit({dims})
    LIMIT %(pool)s) AS hamming
  ORDER BY score DESC, id
  LIMIT %(candidates)s)"""

# During an embedder change's rebuild (memory.pg.vectors): the previous model's query against the
# previous model's vectors, exactly (no index holds them; one scan of the user's chunks).
_VECTOR_PREVIOUS = """
vec AS (
  SELECT id, score FROM (
    SELECT c.id,
           1 - ((c.embedding_previous::halfvec({dims})) <=> %(query)s::halfvec({dims})) AS score
    FROM recalld_memory_chunks c
    WHERE c.user_id = %(user)s AND c.embedding_previous IS NOT NULL{filters}
    ORDER BY score DESC, c.id
    LIMIT %(candidates)s) AS nearest
  ORDER BY score DESC, id)"""

_FUSE = """
kw_n AS (
  SELECT id, score, row_number() OVER (ORDER BY score DESC, id) AS rank,
         CASE WHEN max(score) OVER () > lo
              THEN greatest(0.0, (score - lo) / (max(score) OVER () - lo))
              WHEN score >= max(score) OVER () THEN 1.0 ELSE 0.0 END AS norm
  FROM kw CROSS JOIN (SELECT min(score) AS lo FROM (SELECT score FROM kw ORDER BY score DESC
                                                    LIMIT %(depth)s) AS top) AS kw_lo),
vec_n AS (
  SELECT id, score, row_number() OVER (ORDER BY score DESC, id) AS rank,
         CASE WHEN max(score) OVER () > lo
              THEN greatest(0.0, (score - lo) / (max(score) OVER () - lo))
              WHEN score >= max(score) OVER () THEN 1.0 ELSE 0.0 END AS norm
  FROM vec CROSS JOIN (SELECT min(score) AS lo FROM (SELECT score FROM vec ORDER BY score DESC
                                                     LIMIT %(depth)s) AS top) AS vec_lo),
weights AS (
  SELECT CASE WHEN both_legs THEN %(keyword_weight)s ELSE 1.0 END AS kw,
         CASE WHEN both_legs THEN 1.0 - %(keyword_weight)s ELSE 1.0 END AS vec
  FROM (SELECT EXISTS (SELECT 1 FROM kw) AND EXISTS (SELECT 1 FROM vec) AS both_legs) AS legs),
fused AS (
  SELECT coalesce(k.id, v.id) AS id,
         weights.kw * coalesce(CASE WHEN %(rrf)s THEN 1.0 / (%(rrf_k)s + k.rank) ELSE k.norm END, 0)
         + weights.vec * coalesce(CASE WHEN %(rrf)s THEN 1.0 / (%(rrf_k)s + v.rank)
                                       ELSE v.norm END, 0) AS score,
         k.rank AS kw_rank, v.rank AS vec_rank, v.score AS similarity
  FROM kw_n k FULL OUTER JOIN vec_n v ON k.id = v.id CROSS JOIN weights)
SELECT f.id, c.session_key, c.content, f.score::float8, c.line_start, c.line_end, c.start_ts,
       c.end_ts, f.kw_rank, f.vec_rank, f.similarity::float8, coalesce(c.end_ms, c.start_ms)
FROM fused f JOIN recalld_memory_chunks c ON c.id = f.id
ORDER BY f.score DESC, least(f.kw_rank, f.vec_rank), f.id
LIMIT %(limit)s"""

# HNSW's candidate list per query (``hnsw.ef_search``), at least this and 4 × ``candidates``.
# At 100k chunks of the scale corpus, 100 (pgvector's 40 raised to 2 × candidates) gave
# recall@10 0.915–0.921 against the exact scan; a longer list finds more of the true nearest
# in the first pass. One 100k build measured by ``python -m research.hnsw_ef`` (100 queries):
# ef 200 → 0.950 (p50 11.6 ms), 300 → 0.956, 400 → 0.959 (12.0 ms), 600 → 0.965 (14.7 ms);
# another build read 0.941 at 200, so 400 keeps the goal of 0.95 with margin for under half a
# millisecond. The iterative scan (pgvector ≥ 0.8) goes on past it when filters drop rows.
HNSW_EF_SEARCH = 400


def ef_search(config: MemoryConfig) -> int:
    return max(HNSW_EF_SEARCH, 4 * config.candidates)


_HNSW_SETTINGS = ("SELECT set_config('hnsw.ef_search', %s, {local}), "
                  "set_config('hnsw.iterative_scan', 'relaxed_order', {local})")


async def set_hnsw_search(conn: AsyncConnection[TupleRow], config: MemoryConfig) -> None:
    """This transaction's HNSW scan settings (``SET LOCAL``: they end with it)."""
    await conn.execute(_HNSW_SETTINGS.format(local="true").encode(), (str(ef_search(config)),))


# The Hamming pool of the "bit" leg: SQLite's pre-filter keeps 1,000 by Hamming distance
# (memory.sqlite.search.RERANK_SCAN); here all of them go to the exact cosine.
BIT_POOL = 1000


def build_statement(request: SearchRequest, *, keyword: bool, dims: int | None,
                    leg: VectorLeg, previous: bool = False, phrases: bool = False) -> str:
    """The one statement for these filters and legs (a fixed text per combination);
    ``previous``: the vector leg reads the previous model's vectors; ``phrases``: a query term
    has several tokens (:data:`_PHRASES`)."""
    filters = "".join(_FILTERS[n] for n in _FILTERS if getattr(request, n) is not None)
    matched = filters + (_PHRASES if phrases else "")
    kw = (_KEYWORD_LEG.format(filters=matched, chunk_join=_CHUNK_JOIN if matched else "")
          if keyword else _NO_KEYWORD_LEG)
    if dims is None:
        vec = _NO_VECTOR_LEG
    else:
        shape = _VECTOR_PREVIOUS if previous else _VECTOR_HNSW if leg == "hnsw" else _VECTOR_BIT
        vec = shape.format(dims=int(dims), filters=filters)
    return f"WITH {kw},\n{vec},\n{_FUSE}"


class PgSearch:
    """Runs a :class:`SearchRequest` against the PostgreSQL index."""

    def __init__(self, pool: AsyncConnectionPool[AsyncConnection[TupleRow]], config: MemoryConfig,
                 *, vector_leg: VectorLeg = "hnsw") -> None:
        self.pool = pool
        self.config = config
        self.vector_leg: VectorLeg = vector_leg
        # The pool's connections whose HNSW settings this searcher has set (a reconnection is a
        # new connection, set again).
        self._configured: WeakKeyDictionary[AsyncConnection[TupleRow], int] = WeakKeyDictionary()
        # The stored vectors' width as last read (meta.vector_dims); see _query.
        self._dims: int | None = None

    async def search(self, request: SearchRequest, *, query_vector: Sequence[float] | None,
                     keyword: bool = True, previous: bool = False) -> list[SearchHit]:
        """Hits for ``request``; the vector leg runs when ``query_vector`` is given, against the
        previous model's vectors when ``previous`` (a rebuild; the caller checked its width)."""
        try:
            return await self._search(request, query_vector, keyword, previous)
        except psycopg.errors.DataException:
            if self._dims is None or previous:
                raise
            # pgvector refused to cast a stored vector to the remembered width: another node's
            # embedder change has stored vectors of another width since. Read it again, once.
            self._dims = None
            return await self._search(request, query_vector, keyword, previous)

    async def _search(self, request: SearchRequest, query_vector: Sequence[float] | None,
                      keyword: bool, previous: bool) -> list[SearchHit]:
        windowed = request.within_window()
        async with self.pool.connection() as conn:
            # One statement sees one snapshot by itself: no transaction, so no BEGIN and COMMIT
            # round trips; the HNSW settings are the connection's, set on its first search.
            await conn.set_autocommit(True)
            try:
                await self._scan_settings(conn)
                if windowed is None:
                    dims, query = await self._query(conn, query_vector, previous)
                    rows = await self._fused(conn, request, query, dims, keyword, previous)
                else:
                    # The window's hits and the rest's come from one snapshot.
                    await conn.set_isolation_level(IsolationLevel.REPEATABLE_READ)
                    try:
                        async with conn.transaction():
                            dims, query = await self._query(conn, query_vector, previous)
                            inside = await self._fused(conn, windowed, query, dims, keyword,
                                                       previous)
                            seen = {r[0] for r in inside}
                            rest = await self._fused(conn, replace(request, query=windowed.query),
                                                     query, dims, keyword, previous)
                            rows = inside + [r for r in rest if r[0] not in seen]
                    finally:
                        await conn.set_isolation_level(None)
            finally:
                if conn.info.transaction_status == TransactionStatus.IDLE:
                    await conn.set_autocommit(False)   # (a broken one the pool replaces)
        return [_hit(r) for r in rows[:request.k]]

    async def _scan_settings(self, conn: AsyncConnection[TupleRow]) -> None:
        """``hnsw.ef_search`` and the relaxed iterative scan for the rest of this connection's
        life, once per connection (in autocommit: a rollback cannot undo them). Set per search
        in a transaction, they cost four round trips a search (BEGIN, the two settings, COMMIT).
        Before pgvector is loaded on the connection they are placeholders, which it takes."""
        ef = ef_search(self.config)
        if self._configured.get(conn) != ef:
            await conn.execute(_HNSW_SETTINGS.format(local="false").encode(), (str(ef),))
            self._configured[conn] = ef

    async def _query(self, conn: AsyncConnection[TupleRow], query_vector: Sequence[float] | None,
                     previous: bool = False) -> tuple[int | None, str | None]:
        """The stored vectors' width and the query as a halfvec literal; the query is None (no
        vector leg) without a query vector or when its width is not the stored vectors'.

        The width is read once and remembered while it is the query's, which saves a round
        trip per search (a tenth of a hybrid search at 100k). It changes only with the
        embedder: a node's own change gives its queries another width (read again here), and
        another node's stores vectors the remembered width cannot cast (pgvector's "expected N
        dimensions", read again by :meth:`search`). Until vectors are stored it is read each
        time."""
        if query_vector is None:
            return None, None
        if previous:   # its width is the previous vectors' (memory.embedders.previous checks it)
            return len(query_vector), _halfvec(query_vector)
        dims = self._dims
        if dims is None or dims != len(query_vector):
            dims = self._dims = await vector_dims(conn)
        return dims, _halfvec(query_vector) if dims == len(query_vector) else None

    async def _fused(self, conn: AsyncConnection[TupleRow], request: SearchRequest,
                     query: str | None, dims: int | None, keyword: bool,
                     previous: bool = False) -> list[tuple[Any, ...]]:
        words = [t[1:-1].replace('""', '"')
                 for t in fts_terms(request.query, self.config.max_query_terms)]
        use_keyword = keyword and bool(words)
        if not use_keyword and query is None:
            return []
        sql = build_statement(request, keyword=use_keyword,
                              dims=dims if query is not None else None, leg=self.vector_leg,
                              previous=previous, phrases=any(" " in w for w in words))
        params = statement_params(self.config, request, words, query)
        rows = [tuple(r) for r in await (await conn.execute(sql.encode(), params)).fetchall()]
        now_ms = request.now_ms if _with_recency(request) else None
        if now_ms is None or not rows:
            return rows
        by_id = {r[0]: r for r in rows}
        fused = [Fused(int(r[0]), float(r[3]), r[8], r[9], r[10]) for r in rows]
        said = {int(r[0]): (int(r[11]) if r[11] is not None else None) for r in rows}
        return [(*by_id[f.chunk_id][:3], f.score, *by_id[f.chunk_id][4:])
                for f in with_recency(fused, said, now_ms, self.config)]


def _with_recency(request: SearchRequest) -> bool:
    return request.recency and request.mode == "hybrid" and request.now_ms is not None


def statement_params(config: MemoryConfig, request: SearchRequest, words: list[str],
                     query: str | None) -> dict[str, Any]:
    """The parameters of :func:`build_statement`'s statement for ``request``. It returns the
    first ``k`` fused rows (texts included), or all of them where the recency term re-orders
    them here; a windowed search's two statements each need no more than ``k`` either."""
    params: dict[str, Any] = {
        "user": request.user, "words": words, "query": query,
        "candidates": config.candidates, "pool": max(BIT_POOL, config.candidates),
        "keyword_weight": config.keyword_weight, "depth": config.fusion_depth,
        "rrf": config.fusion == "rrf", "rrf_k": config.rrf_k,
        "common_share": config.keyword_common_share,
        "common_min": config.keyword_common_min_chunks,
        "limit": None if _with_recency(request) else request.k,
    }
    params.update((n, getattr(request, n)) for n in _FILTERS if getattr(request, n) is not None)
    return params


def _halfvec(vector: Sequence[float]) -> str:
    """The query as the int8 integers the stored vectors hold (SQLite's re-rank quantizes it
    too)."""
    ints = memoryview(quantize_int8(vector)).cast("b").tolist()
    return "[" + ",".join(str(i) for i in ints) + "]"


def _hit(r: Sequence[Any]) -> SearchHit:
    return SearchHit(int(r[0]), str(r[1]), str(r[2]), float(r[3]), int(r[4]), int(r[5]), r[6], r[7],
                     int(r[8]) if r[8] is not None else None,
                     int(r[9]) if r[9] is not None else None,
                     float(r[10]) if r[10] is not None else None)


_AROUND_PG = AROUND_SQL.format(table="recalld_memory_chunks", user="user_id").replace("?", "%s")


async def around_pg(pool: AsyncConnectionPool[AsyncConnection[TupleRow]], user: str,
                    hit: SearchHit) -> list[ChunkSpan]:
    """The chunks around ``hit`` (memory.retrieval.neighbours), as the SQLite index reads them."""
    try:
        async with pool.connection() as conn:
            cur = await conn.execute(_AROUND_PG, (user, hit.session_key,
                                                  hit.line_start - 1, hit.line_end + 1))
            return spans(await cur.fetchall())
    except psycopg.Error as exc:
        raise MemoryStorageError(f"storage error: {type(exc).__name__}") from exc
