"""``PgMemory``: the memory surface the gateway uses, over the PostgreSQL index.

Thin on purpose: it validates a search as :class:`memory.MemoryService` does
(:meth:`SearchRequest.build`), embeds the query through the same pipeline, and hands the work
to :class:`memory.pg.search.PgSearch`, :class:`memory.pg.indexer.PgIndexer` and the facts and
episodes stores. Phase 2 fits it to the memory Protocol the gateway depends on.

``start()`` runs this node's indexing loop: it ``LISTEN``s on ``recalld_messages`` (the
sessions store notifies after each committed append), waits ``debounce_ms`` after a wake-up so
a burst of appends is one pass, and also runs a pass every ``poll_s`` without one — a
notification sent while the listening connection was down is never waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from datetime import datetime
from typing import Any

import psycopg
import structlog
from psycopg import AsyncConnection
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from memory.config import MemoryConfig
from memory.embedders.embeddings import Embedder, EmbeddingPipeline
from memory.errors import EmbedderError, MemoryStorageError
from memory.forgetting import ForgetRange
from memory.pg.episodes import PgEpisodeStore
from memory.pg.facts import PgFactStore
from memory.pg.indexer import SESSION_STATS_SQL, IndexReport, PgIndexer
from memory.pg.migrations import migrate
from memory.pg.search import PgSearch
from memory.pg.vectors import VectorLeg
from memory.retrieval.request import SearchRequest, SearchResponse

__all__ = ["PgMemory"]

log = structlog.get_logger("memory.pg")

_QUERY_CACHE = 16


class PgMemory:
    """Search, status, reindex, forget and indexing passes over one PostgreSQL database."""

    def __init__(self, pool: AsyncConnectionPool[AsyncConnection[TupleRow]], dsn: str, config: MemoryConfig,
                 embedder: Embedder | None, *, embedder_reason: str = "", vector_leg: VectorLeg = "hnsw",
                 poll_s: float = 30.0) -> None:
        self.pool = pool
        self.dsn = dsn   # the indexing loop's LISTEN connection is its own, outside the pool
        self.poll_s = poll_s
        self.config = config
        self.embedder = embedder
        self.embedder_reason = embedder_reason
        self.pipeline = EmbeddingPipeline.from_config(embedder, config) if embedder is not None else None
        self.indexer = PgIndexer(pool, config, self.pipeline, vector_leg=vector_leg)
        self.searcher = PgSearch(pool, config, vector_leg=vector_leg)
        self.facts = PgFactStore(config.facts_dedup_threshold, config.facts_max_chars, config.facts_max_per_user)
        self.episodes = PgEpisodeStore()
        self.last_report: IndexReport | None = None
        self.last_error: str | None = None
        self.loop_passes = 0   # passes the indexing loop has finished (status, tests)
        self._loop: asyncio.Task[None] | None = None
        self._query_vectors: OrderedDict[str, list[float]] = OrderedDict()

    @classmethod
    async def open(cls, dsn: str, config: MemoryConfig, embedder: Embedder | None, *,
                   embedder_reason: str = "", vector_leg: VectorLeg = "hnsw", max_size: int = 8,
                   poll_s: float = 30.0) -> PgMemory:
        """Migrate (under the advisory lock) and open a pool; raises MemoryStorageError."""
        try:
            await asyncio.to_thread(_migrate, dsn)
            pool: AsyncConnectionPool[AsyncConnection[TupleRow]] = AsyncConnectionPool(
                dsn, min_size=1, max_size=max_size, open=False)
            await pool.open(wait=True)
        except (psycopg.Error, TimeoutError) as exc:
            raise MemoryStorageError(f"storage error: {type(exc).__name__}") from exc
        return cls(pool, dsn, config, embedder, embedder_reason=embedder_reason, vector_leg=vector_leg, poll_s=poll_s)

    def start(self) -> None:
        """Start this node's indexing loop (a catch-up pass first)."""
        if self._loop is None:
            self._loop = asyncio.create_task(self._index_loop(), name="recalld-pg-indexer")

    async def close(self) -> None:
        """Stop the loop, then the pool; safe twice."""
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop
        await self.pool.close()

    async def _index_loop(self) -> None:
        while True:
            try:
                listener = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
                async with listener:
                    await listener.execute("LISTEN recalld_messages")
                    while True:
                        await self._pass()
                        woke = False
                        async for _ in listener.notifies(timeout=self.poll_s, stop_after=1):
                            woke = True
                        if woke:
                            await asyncio.sleep(self.config.debounce_ms / 1000)
            except psycopg.Error as exc:
                self.last_error = f"storage error: {type(exc).__name__}"
                log.warning("memory.pg.listen_failed", error=self.last_error)
                await asyncio.sleep(self.poll_s)

    async def _pass(self) -> None:
        try:
            await self.sync_now()
            self.last_error = None
        except (psycopg.Error, EmbedderError) as exc:
            # Chunks stay pending (keyword-searchable); the next pass retries.
            self.last_error = str(exc) if isinstance(exc, EmbedderError) else f"storage error: {type(exc).__name__}"
            log.warning("memory.pg.index_failed", error=self.last_error)
        finally:
            self.loop_passes += 1

    async def sync_now(self) -> IndexReport:
        """One indexing pass of this node (what it can claim, then what is pending)."""
        self.last_report = await self.indexer.run_once()
        return self.last_report

    async def search(self, user: str, query: str, *, k: int | None = None, mode: str = "hybrid",
                     session_key: str | None = None, exclude_session_key: str | None = None,
                     after: str | None = None, before: str | None = None, now: datetime | None = None,
                     recency: bool = False) -> SearchResponse:
        request = SearchRequest.build(self.config, user, query, k=k, mode=mode, session_key=session_key,
                                      exclude_session_key=exclude_session_key, after=after, before=before,
                                      now=now, recency=recency)
        started = time.perf_counter()
        actual, fallback, vector = request.mode, None, None
        if request.mode != "keyword":
            if self.pipeline is None:
                why = self.embedder_reason or "no embedder"
                actual, fallback = "keyword", f"no embedder ({why})"
            else:
                try:
                    vector = await self._query_vector(request.query)
                except EmbedderError as exc:
                    actual, fallback = "keyword", f"query embedding failed: {exc}"
        embedded_at = time.perf_counter()
        try:
            hits = await self.searcher.search(request, query_vector=vector, keyword=actual != "vector")
        except psycopg.Error as exc:
            raise MemoryStorageError(f"storage error: {type(exc).__name__}") from exc
        done = time.perf_counter()
        timings = {"embedMs": round((embedded_at - started) * 1000, 2),
                   "searchMs": round((done - embedded_at) * 1000, 2)}
        return SearchResponse(hits, actual, fallback, timings)

    async def _query_vector(self, text: str) -> list[float]:
        """A few recent queries' vectors: a recall and its search, or one question asked in
        several modes, embed once (as MemoryService does)."""
        assert self.pipeline is not None
        cached = self._query_vectors.get(text)
        if cached is not None:
            self._query_vectors.move_to_end(text)
            return cached
        vector = await self.pipeline.embed_query(text)
        self._query_vectors[text] = vector
        while len(self._query_vectors) > _QUERY_CACHE:
            self._query_vectors.popitem(last=False)
        return vector

    async def status(self, user: str | None = None) -> dict[str, Any]:
        where, args = ("WHERE user_id = %s", (user,)) if user is not None else ("", ())
        async with self.pool.connection() as conn:
            row = await (await conn.execute(
                f"SELECT count(DISTINCT session_key), count(*), count(embedding), count(*) - count(embedding) "
                f"FROM recalld_memory_chunks {where}", args)).fetchone()
            cache = await (await conn.execute("SELECT count(*) FROM recalld_memory_embedding_cache")).fetchone()
        sessions, chunks, embedded, pending = (int(v) for v in row) if row else (0, 0, 0, 0)
        state: dict[str, Any] = {
            "sessions": sessions, "chunks": chunks, "embedded": embedded, "pending": pending,
            "provider": self.embedder.provider if self.embedder else "none",
            "model": self.embedder.model_id if self.embedder else None,
            "embedderReason": self.embedder_reason,
            "lastError": self.last_error,
            "scope": "all" if user is None else "user",
        }
        if user is None:
            state["cacheEntries"] = int(cache[0]) if cache else 0
        return state

    async def reindex(self, full: bool = False, *, user: str | None = None) -> None:
        """``full``: forget how far each session (of ``user``) was chunked; the next pass
        re-chunks them (identical chunks stay, and every text is still in the cache)."""
        if not full:
            return
        async with self.pool.connection() as conn:
            await conn.execute("UPDATE recalld_memory_progress SET chunking = 'reset' "
                               "WHERE %(user)s::text IS NULL OR user_id = %(user)s", {"user": user})

    async def delete_session(self, user: str, session_key: str) -> int:
        async with self.pool.connection() as conn:
            cur = await conn.execute("DELETE FROM recalld_memory_chunks WHERE user_id = %s AND session_key = %s",
                                     (user, session_key))
            await conn.execute(SESSION_STATS_SQL, ([session_key],))
            return cur.rowcount

    async def forget(self, r: ForgetRange, *, record: bool) -> dict[str, int]:
        """Chunks overlapping the range go now; ``record`` keeps the range so re-chunking
        never brings them back (the indexer drops matches whenever it writes)."""
        params = {"user": r.user, "session_key": r.session_key, "after_ms": r.after_ms, "before_ms": r.before_ms}
        async with self.pool.connection() as conn, conn.transaction():
            if record:
                await conn.execute("INSERT INTO recalld_memory_forgotten (user_id, session_key, after_ms, before_ms) "
                                   "VALUES (%(user)s, %(session_key)s, %(after_ms)s, %(before_ms)s)", params)
            cur = await conn.execute(
                "DELETE FROM recalld_memory_chunks WHERE user_id = %(user)s "
                "AND (%(session_key)s::text IS NULL OR session_key = %(session_key)s) "
                "AND (%(after_ms)s::bigint IS NULL OR coalesce(end_ms, start_ms) >= %(after_ms)s) "
                "AND (%(before_ms)s::bigint IS NULL OR start_ms < %(before_ms)s) RETURNING session_key", params)
            touched = sorted({str(k) for (k,) in await cur.fetchall()})
            await conn.execute(SESSION_STATS_SQL, (touched,))
        return {"chunks": cur.rowcount}


def _migrate(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn)
