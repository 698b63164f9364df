"""``PgMemory``: the :class:`memory.protocols.Memory` the gateway uses, over the PostgreSQL index.

Thin on purpose: it validates a search as :class:`memory.MemoryService` does
(:meth:`SearchRequest.build`), embeds the query through the same pipeline, and hands the work
to :class:`memory.pg.search.PgSearch`, :class:`memory.pg.indexer.PgIndexer` and the facts and
episodes services (:class:`memory.facts.Facts`, :class:`memory.episodes.Episodes`, the rules both
backends run, over :mod:`memory.pg.facts` and :mod:`memory.pg.episodes`); the fused candidates
go through the same re-rank step (:class:`memory.retrieval.rerank_step.RerankStep`).
A run's context and recall use memory's own rules (:func:`memory.context.gather_context`,
:func:`memory.retrieval.recall.for_prompt`).

``start()`` runs this node's indexing loop: it ``LISTEN``s for the sessions store's change
notifications (:func:`sessions.pg.feed.listen`; the store notifies after each committed append),
waits ``debounce_ms`` after a wake-up so a burst of appends is one pass, and also runs a pass every
``poll_s`` without one — a notification sent while the listening connection was down is never waited
for.

What the SQLite service's syncing calls mean here: there are no transcript files, so
``nudge()`` does nothing (every committed append already wakes the loop of every node);
``catch_up()`` lets the loop run its first pass when ``start(catch_up=False)`` held it back;
``sync_now()`` runs one pass of this node at once (``progress`` is not reported: a pass is
a few claimed sessions, not a walk of files) and ``reindex()`` wakes every node's loop
(``full``: every session is re-chunked, every vector read back from the shared cache).
An embedder change is rebuilt as on SQLite: until every chunk has the new model's vector, the
previous model's vectors answer the vector leg when this node can embed the query with it
(:mod:`memory.pg.vectors`, :mod:`memory.embedders.previous`), else hybrid is keyword-only and says
why; ``vectorSearch.rebuild`` shows the progress. Not supported yet: chunks removed by the
retention sweep come back on a full reindex until the next sweep.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Any

import psycopg
import psycopg_pool
import structlog
from psycopg import AsyncConnection
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from memory.config import MemoryConfig
from memory.context import MemoryContext, RunMemory, gather_context
from memory.embedders.embeddings import Embedder, EmbeddingPipeline, RecentQueries
from memory.embedders.previous import (
    NOT_BUILT,
    NOT_REBUILDING,
    EmbedderIdentity,
    PreviousFactory,
    PreviousModel,
    RebuildState,
    RoutedQuery,
    rebuilding_reason,
    relevance_floor,
    route_query,
    vector_search_status,
)
from memory.episodes import Episodes
from memory.errors import EmbedderError, MemoryStorageError, MemoryUnavailable
from memory.facts import Facts
from memory.forget_range import ForgetRange, retention_cutoff_ms
from memory.pg.episodes import PgEpisodeStore
from memory.pg.facts import PgFactStore
from memory.pg.indexer import SESSION_STATS_SQL, PgIndexer
from memory.pg.migrations import migrate
from memory.pg.search import PgSearch, around_pg
from memory.pg.steps import PoolSteps
from memory.pg.vectors import (
    Superseded,
    VectorLeg,
    previous_dims_of,
    rebuild_state,
    superseded,
)
from memory.reports import ProgressCallback, SyncLog, SyncReport
from memory.retrieval.excerpts import excerpts_for_prompt
from memory.retrieval.request import SearchHit, SearchRequest, SearchResponse, ShownHistory
from memory.retrieval.rerank_step import RerankStep
from sessions import SchemaTooNew, pg_feed

__all__ = ["PgMemory"]

log = structlog.get_logger("memory.pg")

# Tries of a delete that PostgreSQL aborted as a deadlock with an indexer (see _delete_chunks).
_DELETE_ATTEMPTS = 4
# How long close() waits for the indexing loop to take its cancel before it ends the loop's wait.
_CLOSE_WAIT_S = 5.0


class PgMemory:
    """Search, context, status, reindex, forget and indexing passes over one PostgreSQL database."""

    def __init__(self, pool: AsyncConnectionPool[AsyncConnection[TupleRow]], dsn: str,
                 config: MemoryConfig, embedder: Embedder | None, *, data_dir: Path,
                 embedder_reason: str = "", vector_leg: VectorLeg = "hnsw",
                 poll_s: float = 30.0, previous_embedder: PreviousFactory | None = None) -> None:
        self.pool = pool
        self.dsn = dsn   # the indexing loop's LISTEN connection is its own, outside the pool
        self.data_dir = data_dir  # the node's own files; memory keeps none there
        self.poll_s = poll_s
        self._config = config
        self.embedder = embedder
        self.embedder_reason = embedder_reason
        self.vector_leg = vector_leg
        self.pipeline = (EmbeddingPipeline.from_config(embedder, config) if embedder is not None
                         else None)
        self.identity = EmbedderIdentity.of(embedder) if embedder is not None else None
        # After an embedder change: whether this identity's vectors are being (re)built, the
        # previous model that serves the vector leg meanwhile (memory.pg.vectors), and whether
        # the leg may run with this embedder (and why not) — read after each pass.
        self.rebuild: RebuildState = NOT_REBUILDING
        self.replaced: Superseded | None = None   # by a node started later (memory.pg.vectors)
        self.previous = PreviousModel(config, previous_embedder)
        self.vector_state: tuple[bool, str] = (
            (True, "") if self.pipeline is not None
            else (False, f"no embedder ({embedder_reason or 'no embedder'})"))
        self.indexer = PgIndexer(pool, config, self.pipeline, vector_leg=vector_leg)
        self.searcher = PgSearch(pool, config, vector_leg=vector_leg)
        self.rerank = RerankStep(config, embedder)
        steps = PoolSteps(pool)
        self.facts = Facts(steps, PgFactStore(config.facts_dedup_threshold, config.facts_max_chars,
                                              config.facts_max_per_user),
                           self.pipeline, self.embed_query, config.keyword_weight)
        self.episodes = Episodes(steps, PgEpisodeStore(), self.pipeline, self.embed_query,
                                 config.keyword_weight)
        # Set by whoever schedules the retention sweep (the gateway); shown by status().
        self.retention_status: dict[str, Any] = {}
        self.loop_passes = 0   # passes the indexing loop has finished (status, tests)
        self._closed = False
        self._syncs = SyncLog()
        self._sync_lock = asyncio.Lock()  # one pass of this node at a time (the loop, sync_now)
        self._caught_up = asyncio.Event()  # set: the loop may run its first pass
        self._loop: asyncio.Task[None] | None = None
        self._listener: psycopg.AsyncConnection[Any] | None = None  # the loop's LISTEN connection
        self._recent = RecentQueries(self.pipeline) if self.pipeline else None

    @classmethod
    async def open(cls, dsn: str, config: MemoryConfig, embedder: Embedder | None, *,
                   data_dir: Path, embedder_reason: str = "", vector_leg: VectorLeg = "hnsw",
                   max_size: int = 8, poll_s: float = 30.0, connect_timeout_s: float = 10.0,
                   call_timeout_s: float = 4.0, reconnect_timeout_s: float = 1.0,
                   options: str = "", previous_embedder: PreviousFactory | None = None,
                   decides_embedder: bool = True) -> PgMemory:
        """Migrate (under the advisory lock) and open a pool, the opening bounded by
        ``connect_timeout_s``; raises MemoryStorageError with the server's reason (never the DSN).

        The pool then behaves as the sessions store's (:class:`sessions.PgSessionStore`): a call
        waits at most ``call_timeout_s`` for a connection, each connection is checked before it
        is handed out (one a database restart killed is replaced, not used), a lost one is
        retried in the background for ``reconnect_timeout_s`` and then at the next call, and
        every pooled connection gets the libpq ``options`` (statement and lock timeouts).
        ``previous_embedder`` builds the query embedder of a previous identity while vectors
        are rebuilt (default: from the configuration,
        ``memory.embedders.embeddings.previous_embedder``). ``decides_embedder`` False (a CLI
        command, not a node): its embedder is never made the recorded one; with another one
        it fills no vector."""
        timeout = max(2, round(connect_timeout_s))
        try:
            await asyncio.to_thread(_migrate, dsn, timeout)
            pool: AsyncConnectionPool[AsyncConnection[TupleRow]] = AsyncConnectionPool(
                dsn, min_size=1, max_size=max_size, open=False, name="recalld-memory",
                kwargs={"connect_timeout": max(2, round(call_timeout_s)),
                        **({"options": options} if options else {})},
                check=AsyncConnectionPool.check_connection, timeout=call_timeout_s,
                reconnect_timeout=reconnect_timeout_s)
            try:
                await pool.open(wait=True, timeout=connect_timeout_s)
            except BaseException:
                await pool.close()
                raise
        except SchemaTooNew as exc:  # a newer node migrated the tables: its reason as it is
            raise MemoryStorageError(str(exc)) from exc
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise MemoryStorageError(_why(exc)) from exc
        node = cls(pool, dsn, config, embedder, data_dir=data_dir, embedder_reason=embedder_reason,
                   vector_leg=vector_leg, poll_s=poll_s, previous_embedder=previous_embedder)
        node.indexer.decides = decides_embedder
        try:
            await node.refresh_vectors()
        except psycopg.Error as exc:
            await node.close()
            raise MemoryStorageError(_why(exc)) from exc
        return node

    @property
    def config(self) -> MemoryConfig:
        return self._config

    @config.setter
    def config(self, config: MemoryConfig) -> None:
        """The service's own rules (retention, recall, re-rank) read the new settings from their
        next call on; the indexer and the searcher keep those they were opened with."""
        self._config = config
        self.rerank.config = config

    @property
    def sync_count(self) -> int:
        """Indexing passes of this node finished since start."""
        return self._syncs.count

    # --- life cycle and syncing ----------------------------------------------------------

    async def start(self, *, catch_up: bool = True) -> None:
        """Start this node's indexing loop; its first pass (the catch-up) waits for
        :meth:`catch_up` when ``catch_up`` is False."""
        if catch_up:
            self._caught_up.set()
        if self._loop is None:
            self._loop = asyncio.create_task(self._index_loop(), name="recalld-pg-indexer")

    def catch_up(self) -> None:
        self._caught_up.set()

    def nudge(self) -> None:
        """Nothing to do: each committed append notifies every node's loop (module docstring)."""

    async def close(self) -> None:
        """Stop the loop, then the pool; safe twice. Calls after it raise MemoryUnavailable."""
        self._closed = True
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.cancel()
            done, _ = await asyncio.wait({loop}, timeout=_CLOSE_WAIT_S)
            if not done:
                # A cancel landing in psycopg's notifies() wait was seen to be absorbed (the loop
                # went on waiting, and close() with it, for good): closing the LISTEN connection
                # ends that wait with an error, and the loop's retry sleep takes the cancel.
                log.warning("memory.pg.loop_stop_slow", waited_s=_CLOSE_WAIT_S)
                if self._listener is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(self._listener.close(), _CLOSE_WAIT_S)
                loop.cancel()
                await asyncio.wait({loop}, timeout=_CLOSE_WAIT_S)
            if loop.done() and not loop.cancelled() and loop.exception() is not None:
                # psycopg can turn a cancel landing inside a pipeline into an AssertionError of its
                # own.
                exc = loop.exception()
                log.warning("memory.pg.loop_stopped_with", error=f"{type(exc).__name__}: {exc}")
            elif not loop.done():
                log.error("memory.pg.loop_not_stopped")  # left behind: the pool closes all the same
        await self.previous.close()
        await self.pool.close()

    async def _index_loop(self) -> None:
        await self._caught_up.wait()
        while True:
            try:
                # Bounded as the pool's connections are: a server that does not answer is retried.
                listener = self._listener = await psycopg.AsyncConnection.connect(
                    self.dsn, autocommit=True, connect_timeout=max(2, round(self.pool.timeout)))
                async with listener:
                    await pg_feed.listen(listener)
                    while True:
                        await self._pass()
                        woke = False
                        async for _ in listener.notifies(timeout=self.poll_s, stop_after=1):
                            woke = True
                        if woke:
                            await asyncio.sleep(self.config.debounce_ms / 1000)
            except psycopg.Error as exc:
                self._syncs.last_error = f"storage error: {_shown(exc)}"
                log.warning("memory.pg.listen_failed", error=_why(exc))
                await asyncio.sleep(self.poll_s)

    async def _pass(self) -> None:
        try:
            await self.sync_now()
        except (MemoryStorageError, EmbedderError) as exc:
            # Chunks stay pending (keyword-searchable); the next pass retries.
            log.warning("memory.pg.index_failed", error=str(exc))
        finally:
            self.loop_passes += 1

    def _check_open(self) -> None:
        # As MemoryService: a closed service says so, rather than its pool's PoolClosed.
        if self._closed:
            raise MemoryUnavailable("memory service is closed")

    async def sync_now(self, progress: ProgressCallback | None = None, *,
                       full: bool = False) -> SyncReport:
        """One indexing pass of this node (what it can claim, then what is pending); ``full``
        re-chunks every session first."""
        if full:
            await self.reindex(full=True)
        async with self._sync_lock:
            started = time.perf_counter()
            self._syncs.syncing = True
            try:
                # An embedder change starts before the pass, and the state is read then: the
                # previous model serves the searches meanwhile, this pass's rebuild among them.
                await self.indexer.ensure_identity()
                await self.refresh_vectors()
                done = await self.indexer.run_pass()
                pending = await self.indexer.pending()
            except (psycopg.Error, EmbedderError) as exc:
                if isinstance(exc, EmbedderError):
                    self._syncs.last_error = str(exc)
                    raise
                self._syncs.last_error = f"storage error: {_shown(exc)}"
                raise MemoryStorageError("memory index failed while indexing: "
                                         f"{type(exc).__name__}") from exc
            finally:
                self._syncs.syncing = False
                try:   # a failed pass too: another node's change, or the end of a rebuild
                    await self.refresh_vectors()
                except psycopg.Error as exc:   # the state read before stays
                    log.warning("memory.pg.vector_state_failed", error=_why(exc))
            report = SyncReport(files_scanned=done.sessions, files_changed=done.sessions,
                                files_deleted=done.sessions_deleted,
                                chunks_written=done.chunks_written,
                                chunks_deleted=done.chunks_deleted, embedded=done.filled,
                                cache_hits=done.filled - done.embedded,
                                embedder_calls=done.embedded, pending=pending,
                                error="; ".join(done.errors) or None,
                                duration_ms=(time.perf_counter() - started) * 1000)
            self._syncs.record(report)
        await self.rerank.warm()   # after the pass, as on SQLite: no search loads the model
        return report

    async def refresh_vectors(self) -> None:
        """Read whether the vector leg may run and who serves it during a rebuild (after each
        pass: another node's change, or the end of its rebuild, shows at this node's next)."""
        if self.identity is None:
            return
        async with self.pool.connection() as conn:
            # A node is replaced once its own identity was recorded; a command from its start.
            command = not self.indexer.decides
            replaced = (await superseded(conn, self.identity, command=command)
                        if self.indexer.asserted or command else None)
            if replaced is not None:
                await self._superseded_by(replaced)
                return
            self.replaced = None
            rebuild = await rebuild_state(conn, self.identity)
            if not rebuild.rebuilding:
                state = (True, "")
            elif not rebuild.started:
                state = (False, NOT_BUILT)
            else:
                state = (False, rebuilding_reason(await _one(
                    conn, "SELECT count(*) FROM recalld_memory_chunks WHERE embedding IS NULL",
                    {})))
        self.rebuild, self.vector_state = rebuild, state

        # Only once the rebuild has started here are the previous vectors in their column.
        await self.previous.update(rebuild.previous if rebuild.started else None,
                                   previous_dims_of(self.pool))

    async def _superseded_by(self, replaced: Superseded) -> None:
        """Another embedder is recorded than this node's (one started later changed it) or this
        command's (memory.pg.vectors, "The node started last decides"): it leaves it, and says so
        once per change."""
        if self.replaced is None or self.replaced.current != replaced.current:
            assert self.identity is not None
            log.warning("memory.embedder.superseded", node=self.identity.to_json(),
                        cluster=replaced.current.to_json(),
                        effect="fills no vector" + ("" if replaced.command else
                                                    " until restarted with that embedder"))
        self.replaced, self.rebuild = replaced, NOT_REBUILDING
        self.vector_state = (False, replaced.reason)
        await self.previous.update(None, previous_dims_of(self.pool))

    async def reindex(self, full: bool = False, *, user: str | None = None) -> None:
        """Wake every node's loop; ``full`` first forgets how far each session (of ``user``) was
        chunked, so the next pass re-chunks them (identical chunks stay, and every text is still
        in the cache)."""
        async with self.pool.connection() as conn:
            if full:
                await conn.execute("UPDATE recalld_memory_progress SET chunking = 'reset' "
                                   "WHERE %(user)s::text IS NULL OR user_id = %(user)s",
                                   {"user": user})
            await pg_feed.wake(conn)

    # --- reading -------------------------------------------------------------------------

    async def search(self, user: str, query: str, *, k: int | None = None, mode: str = "hybrid",
                     session_key: str | None = None, exclude_session_key: str | None = None,
                     after: str | None = None, before: str | None = None,
                     now: datetime | None = None, recency: bool = False,
                     shown: ShownHistory | None = None) -> SearchResponse:
        self._check_open()
        request = SearchRequest.build(self.config, user, query, k=k, mode=mode,
                                      session_key=session_key,
                                      exclude_session_key=exclude_session_key, after=after,
                                      before=before, now=now, recency=recency, shown=shown)
        started = time.perf_counter()
        routed, own = await self._route(request)
        actual, previous = routed.mode, routed.previous
        embedded_at = time.perf_counter()
        try:
            hits = await self.searcher.search(self.rerank.fetch(request, actual),
                                              query_vector=routed.vector,
                                              keyword=actual != "vector",
                                              previous=previous is not None or own)
        except psycopg.Error as exc:
            raise MemoryStorageError("memory index failed while searching: "
                                     f"{type(exc).__name__}") from exc
        done = time.perf_counter()
        timings = {"embedMs": round((embedded_at - started) * 1000, 2),
                   "searchMs": round((done - embedded_at) * 1000, 2)}
        hits, failed = await self.rerank.apply(request, actual, hits, timings)
        return SearchResponse(hits, actual, routed.fallback or failed, timings,
                              previous_model=previous.model if previous is not None else None)

    async def _route(self, request: SearchRequest) -> tuple[RoutedQuery, bool]:
        """Which model embeds the query (route_query), and whether the leg reads this node's own
        model's earlier vectors (a superseded node, during the rebuild that replaced it)."""
        replaced = self.replaced
        if replaced is None or replaced.own_dims is None or request.mode == "keyword":
            return await route_query(request.mode, request.query, state=self.vector_state,
                                     rebuilding=self.rebuild.rebuilding,
                                     embed=self.embed_query if self.pipeline else None,
                                     previous=self.previous), False
        try:
            vector = await self.embed_query(request.query)
        except EmbedderError as exc:
            return RoutedQuery(None, None, "keyword",
                               f"{replaced.reason}; query embedding failed: {exc}"), False
        if len(vector) != replaced.own_dims:   # as the previous model's width is checked
            return RoutedQuery(None, None, "keyword", replaced.reason), False
        return RoutedQuery(vector, None, request.mode, replaced.reason), True

    async def embed_query(self, text: str) -> list[float]:
        """A few recent queries' vectors: a recall and its search, or one question asked in
        several modes, embed once (as MemoryService does)."""
        assert self._recent is not None  # callers embed only with an embedder
        return await self._recent.embed(text)

    async def recall(self, user: str, message: str, *, k: int,
                     exclude_session_key: str | None = None, now: datetime | None = None,
                     shown: ShownHistory | None = None) -> list[SearchHit]:
        """What to put in a prompt answering ``message``: MemoryService.recall's hybrid search with
        the recency term, then memory's rule for excerpts (``excerpts_for_prompt``)."""
        response = await self.search(user, message, k=k, mode="hybrid",
                                     exclude_session_key=exclude_session_key, now=now, recency=True,
                                     shown=shown)
        floor = relevance_floor(self.config, response.previous_model is not None, self.embedder,
                                self.previous)
        return await excerpts_for_prompt(response, message, self.config, floor=floor, shown=shown,
                                         around=lambda hit: around_pg(self.pool, user, hit))

    async def context(self, user: str, message: str, run: RunMemory, *, k: int, shown: ShownHistory,
                      tz: tzinfo) -> MemoryContext:
        """A run's recalled chunks, facts and episodes, by memory's rules (gather_context)."""
        return await gather_context(self, user, message, run, k=k, shown=shown, tz=tz)

    async def status(self, user: str | None = None) -> dict[str, Any]:
        """``memory.status``'s keys (gateway StatusReply): ``files`` counts the sessions the
        indexer tracks; the whole index adds the shared cache and the memory tables' size."""
        self._check_open()
        args = {"user": user}
        mine = "WHERE %(user)s::text IS NULL OR user_id = %(user)s"
        async with self.pool.connection() as conn:
            sessions = await _one(conn, f"SELECT count(*) FROM recalld_memory_progress {mine}",
                                  args)
            chunks = await _one(conn, f"SELECT count(*) FROM recalld_memory_chunks {mine}", args)
            embedded = await _one(
                conn, f"SELECT count(embedding) FROM recalld_memory_chunks {mine}", args)
            version = await (await conn.execute(
                "SELECT extversion FROM pg_extension WHERE extname = 'vector'")).fetchone()
            whole = {} if user is not None else {
                "cacheEntries": await _one(
                    conn, "SELECT count(*) FROM recalld_memory_embedding_cache", {}),
                "dbBytes": await _one(conn, "SELECT coalesce(sum(pg_total_relation_size(oid)), 0) "
                                            r"FROM pg_class WHERE relkind = 'r' "
                                            r"AND relname LIKE 'recalld\_memory\_%%'", {}),
            }
        ready = self.pipeline is not None and self.vector_state[0]
        why = (self.vector_state[1] if self.pipeline is not None
               else self.embedder_reason or "no embedder")
        return {
            "files": sessions, "chunks": chunks, "embedded": embedded, "pending": chunks - embedded,
            "provider": self.embedder.provider if self.embedder else "none",
            "model": self.embedder.model_id if self.embedder else None,
            "dims": (self.embedder.dims or None) if self.embedder else None,
            "embedderReason": self.embedder_reason,
            "vectorBackend": {"available": version is not None,
                              "reason": f"pgvector {version[0]}, {self.vector_leg}" if version else
                                        "pgvector is not installed in this database"},
            "vectorSearch": vector_search_status(
                ready=ready, why="" if ready else why, identity=self.identity,
                rebuild=self.rebuild, previous=self.previous, embedded=embedded, total=chunks,
                served_by=(self.identity if self.replaced and self.replaced.own_dims else None)),
            **self._syncs.wire(),
            "rebuiltFromTranscripts": None,
            "scope": "all" if user is None else "user",
            "retention": {"days": self.config.retention_days, **self.retention_status},
            **whole,
        }

    # --- forgetting ----------------------------------------------------------------------

    async def delete_session(self, user: str, session_key: str) -> int:
        # Its progress row goes too (as the SQLite index drops the file's row): status counts
        # the session no more; the session store re-seeds it if the session still exists.
        return await self._delete_chunks(
            "user_id = %(user)s AND session_key = %(session_key)s",
            {"user": user, "session_key": session_key},
            first="DELETE FROM recalld_memory_progress "
                  "WHERE user_id = %(user)s AND session_key = %(session_key)s")

    async def forget(self, r: ForgetRange, *, record: bool) -> dict[str, int]:
        """Chunks overlapping the range go now, with the facts the model saved from those
        conversations and their episodes; ``record`` keeps the range so re-chunking never
        brings the chunks back (the indexer drops matches whenever it writes)."""
        params = {"user": r.user, "session_key": r.session_key, "after_ms": r.after_ms,
                  "before_ms": r.before_ms}
        record_sql = ("INSERT INTO recalld_memory_forgotten (user_id, session_key, after_ms, "
                      "before_ms) VALUES (%(user)s, %(session_key)s, %(after_ms)s, %(before_ms)s)"
                      if record else None)
        chunks = await self._delete_chunks(
            "user_id = %(user)s "
            "AND (%(session_key)s::text IS NULL OR session_key = %(session_key)s) "
            "AND (%(after_ms)s::bigint IS NULL OR coalesce(end_ms, start_ms) >= %(after_ms)s) "
            "AND (%(before_ms)s::bigint IS NULL OR start_ms < %(before_ms)s)", params,
            first=record_sql)
        facts = await self.facts.forget_derived(r.user, r.session_key, r.after_ms, r.before_ms)
        episodes = await self.episodes.forget(r.user, r.session_key, r.after_ms, r.before_ms)
        log.info("memory.forget", session=r.session_key, chunks=chunks, facts=facts,
                 episodes=episodes, recorded=record)
        return {"chunks": chunks, "facts": facts, "episodes": episodes}

    async def sweep_retention(self, now_ms: int | None = None) -> dict[str, int]:
        """Remove chunks, facts and episodes older than ``retention_days`` (nothing when it is
        0)."""
        cutoff = retention_cutoff_ms(self.config.retention_days, now_ms)
        if cutoff is None:
            return {"chunks": 0, "facts": 0, "episodes": 0}
        chunks = await self._delete_chunks("end_ms < %(cutoff)s", {"cutoff": cutoff})
        facts = await self.facts.prune_older_than(cutoff)
        episodes = await self.episodes.prune_older_than(cutoff)
        return {"chunks": chunks, "facts": facts, "episodes": episodes}

    async def _delete_chunks(self, where: str, params: dict[str, Any], *,
                             first: str | None = None) -> int:
        """Delete the chunks ``where`` picks (a literal of this module; values in ``params``) and
        fix the sessions' BM25 statistics, in one transaction that runs ``first`` before.

        A node's indexer may be writing the same session's chunks and statistics (a reply just
        arrived): PostgreSQL then aborts one of the two transactions as a deadlock. The indexer
        retries at its next pass; a delete the user asked for is retried here, a few times."""
        for attempt in range(_DELETE_ATTEMPTS):
            try:
                async with self.pool.connection() as conn, conn.transaction():
                    if first is not None:
                        await conn.execute(first.encode(), params)
                    cur = await conn.execute(f"DELETE FROM recalld_memory_chunks WHERE {where} "
                                             "RETURNING session_key".encode(), params)
                    touched = sorted({str(k) for (k,) in await cur.fetchall()})
                    await conn.execute(SESSION_STATS_SQL, (touched,))
                    return cur.rowcount
            except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure) as exc:
                if attempt + 1 == _DELETE_ATTEMPTS:
                    raise MemoryStorageError("memory index failed while deleting: "
                                             f"{type(exc).__name__}") from exc
                log.info("memory.pg.delete_retried", attempt=attempt + 1, error=type(exc).__name__)
                await asyncio.sleep(0.05 * (attempt + 1))
            except psycopg.Error as exc:
                raise MemoryStorageError("memory index failed while deleting: "
                                         f"{type(exc).__name__}") from exc
        raise AssertionError("unreachable")


async def _one(conn: AsyncConnection[TupleRow], sql: str, args: dict[str, Any]) -> int:
    row = await (await conn.execute(sql.encode(), args)).fetchone()
    return int(row[0]) if row else 0


def _why(exc: BaseException) -> str:
    """The class and the first line of the driver's or server's message ("OperationalError:
    connection failed: …", "InsufficientPrivilege: permission denied for schema public"), never
    the DSN (libpq does not repeat it); for logs, status and start errors."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _shown(exc: BaseException) -> str:
    """What ``memory.status`` shows of a failure (every user reads it): the server's own
    message when it sent one, else the class: libpq's connection text names the host."""
    primary = exc.diag.message_primary if isinstance(exc, psycopg.Error) and exc.sqlstate else None
    return f"{type(exc).__name__}: {primary}" if primary else type(exc).__name__


def _migrate(dsn: str, connect_timeout: int) -> None:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=connect_timeout) as conn:
        migrate(conn)
