"""``MemoryService``: the async facade the gateway and the CLI use (the surface is the
:class:`~memory.protocols.Memory` Protocol).

It owns the life of the parts of an open index (:class:`~memory.sqlite.live.LiveIndex`): one
:class:`~memory.sqlite.index.db.WriteConnection` shared by
:class:`~memory.sqlite.index.sync.FileSync` and :class:`~memory.sqlite.index.vectors.VectorStore`,
driven by an :class:`~memory.sqlite.index.indexing.Indexer` that the
:class:`~memory.sqlite.index.scheduler.SyncScheduler` runs (one sync at a time, never overlapping);
searches (:class:`~memory.sqlite.pipeline.SearchPipeline`) and status on a
:class:`~memory.sqlite.index.db.ReaderPool` in worker threads (WAL lets them read while the writer
writes), so neither a search nor a sync ever blocks the event loop, and a search never waits for a
sync.

The full integrity check (``PRAGMA quick_check``, O(size)) runs after ``start()`` returns, in a
worker thread (:class:`~memory.sqlite.index.db.IntegrityCheck`); a corrupt file found there is moved
aside and the index rebuilt from the transcripts, as ``open_index`` does for one found at open.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Any, TypeVar

import apsw
import structlog

from memory.config import MemoryConfig
from memory.context import MemoryContext, RunMemory, gather_context
from memory.embedders.embeddings import Embedder
from memory.embedders.previous import PreviousFactory
from memory.episodes import Episodes
from memory.errors import MemoryUnavailable
from memory.facts import Facts
from memory.forget_range import ForgetRange, retention_cutoff_ms
from memory.reports import ProgressCallback, SyncLog, SyncReport
from memory.retrieval.excerpts import excerpts_for_prompt
from memory.retrieval.request import SearchHit, SearchRequest, SearchResponse, ShownHistory
from memory.sqlite.episodes import EpisodeStore
from memory.sqlite.facts import FactStore
from memory.sqlite.index import knn
from memory.sqlite.index.db import (
    DEFAULT_VEC_EXTENSION,
    IndexSteps,
    IntegrityCheck,
    in_thread,
)
from memory.sqlite.index.scheduler import SyncScheduler
from memory.sqlite.live import LiveIndex
from memory.sqlite.pipeline import SearchPipeline
from memory.sqlite.search import around_sqlite
from memory.sqlite.status import DB_NAME, count_rows, db_bytes
from sessions import sessions_root

__all__ = ["MemoryService"]

log = structlog.get_logger("memory.service")


_T = TypeVar("_T")


class MemoryService:
    def __init__(
        self,
        data_dir: Path,
        config: MemoryConfig,
        embedder: Embedder | None,
        *,
        embedder_reason: str = "",
        vec_extension: str | None = DEFAULT_VEC_EXTENSION,
        previous_embedder: PreviousFactory | None = None,
        min_free_bytes: int = 0,
    ) -> None:
        """``previous_embedder`` builds the query embedder of a previous identity while the
        vectors are rebuilt for a new one (default: from ``config``,
        ``memory.embedders.embeddings.previous_embedder``). ``min_free_bytes``: the free-disk
        floor below which writes that add rows are refused (the gateway's
        sessions.min_free_bytes)."""
        self.data_dir = Path(data_dir)
        self.sessions_dir = sessions_root(self.data_dir)
        self.db_path = self.data_dir / DB_NAME
        self._config = config
        self.embedder = embedder
        self.embedder_reason = embedder_reason
        self._vec_extension = vec_extension
        self._min_free_bytes = min_free_bytes
        self._window = embedder.max_tokens if embedder else None  # the token window chunks fit
        self._search = SearchPipeline(config, embedder, embedder_reason, self.db_path,
                                      previous_embedder)
        self._index: LiveIndex | None = None
        self._sync_lock = asyncio.Lock()
        self._scheduler = SyncScheduler(self._scheduled_sync, config.debounce_ms,
                                        retry_s=config.sync_retry_s)
        self._closed = False
        self._integrity: tuple[IntegrityCheck, asyncio.Task[None]] | None = None
        self._warmed = asyncio.Event()  # set once the start's sign-bit load is over (or skipped)
        self._swapping = False  # between closing a corrupt file and opening its replacement
        self._syncs = SyncLog()
        # Set by whoever schedules the retention sweep (the gateway); shown by status().
        self.retention_status: dict[str, Any] = {}

    # --- life cycle ----------------------------------------------------------------------

    async def start(self, *, catch_up: bool = True) -> None:
        """Open the index, schedule the catch-up sync, start the watcher and debounce loop.

        ``catch_up=False`` leaves the first sync to the caller (the CLI runs it with a
        progress bar through :meth:`sync_now`; the gateway schedules it with :meth:`catch_up`
        once the sessions store has reconciled the transcripts).
        """
        if self._index is not None:
            return
        if self._closed:
            raise MemoryUnavailable("memory service is closed")
        self.sessions_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._index = index = await LiveIndex.open(
            self.db_path, self.sessions_dir, self.config, window=self._window,
            vec_extension=self._vec_extension, min_free_bytes=self._min_free_bytes)
        await self._refresh_vector_state()
        log.info("memory.started", db=str(self.db_path),
                 provider=self.embedder.provider if self.embedder else None,
                 vector_backend=index.backend.reason, embedder_reason=self.embedder_reason)
        self._scheduler.start(self.sessions_dir if self.config.watch else None)
        if catch_up:
            self._scheduler.run_soon()
        check = IntegrityCheck(self.db_path)
        self._integrity = (check,
                           asyncio.create_task(self._after_start(check), name="memory-integrity"))

    async def _after_start(self, check: IntegrityCheck) -> None:
        """Start work off the start path, in order: the sign bits first (what the first
        search needs), then the integrity check; the catch-up sync also waits for the first."""
        try:
            await self._warm_sign_bits()
        except Exception:  # searches then load lazily; the check below must still run
            log.exception("memory.sign_index.warm_failed")
        finally:
            self._warmed.set()
        await self._check_integrity(check)

    async def _warm_sign_bits(self) -> None:
        """Load the vector pre-filter's sign bits (``memory.sqlite.index.knn``) before other start
        work.

        Loaded by the first search instead, they took that search ~90 ms at 100k chunks alone
        and up to ~0.5 s while the catch-up sync and the integrity check ran beside it on a
        loaded 2-core machine (bench/README.md, "Scale"). A search arriving meanwhile waits
        for the load on the index's lock, or loads the partition itself if it gets there first.
        """
        index = self._index
        if index is None or not knn.HAVE_NUMPY or not self._search.vector_state[0]:
            return
        started = time.perf_counter()
        users, chunks = await asyncio.to_thread(index.readers.run, index.signs.warm)
        log.info("memory.sign_index.warmed", users=users, chunks=chunks,
                 ms=round((time.perf_counter() - started) * 1000, 1))

    async def _check_integrity(self, check: IntegrityCheck) -> None:
        """The O(size) check, off the start path; a failure rebuilds the index while serving."""
        try:
            await self._verify(check)
        except asyncio.CancelledError:
            raise
        except Exception:  # a failed rebuild must not end silently in an unretrieved task
            log.exception("memory.integrity_check.failed")

    async def _verify(self, check: IntegrityCheck) -> None:
        started = time.perf_counter()
        problem = await asyncio.to_thread(check.run)
        log.info("memory.integrity_checked", ok=problem is None,
                 ms=round((time.perf_counter() - started) * 1000, 1))
        if problem is None or self._closed:
            return
        async with self._sync_lock:  # no sync step may be writing while the file is swapped
            index, self._index = self._index, None
            if index is None:
                return
            self._swapping = True
            try:
                # first: its warm-up may be reading on a connection
                await self._search.previous.close()
                self._index = await index.replace(problem, self.db_path, self.sessions_dir,
                                                  self.config, window=self._window,
                                                  vec_extension=self._vec_extension,
                                                  min_free_bytes=self._min_free_bytes)
                await self._refresh_vector_state()
            finally:
                self._swapping = False
        self._scheduler.run_soon()

    async def wait_idle(self) -> None:
        """Return once no sync is queued or running (tests, the CLI after ``start``)."""
        self._require_index()
        await self._scheduler.wait_idle()

    async def wait_checked(self) -> None:
        """Return once the integrity check ``start()`` began has finished (benchmarks: steady-state
        searches are measured without that one-off full read running beside them)."""
        if self._integrity is not None:
            await asyncio.gather(self._integrity[1], return_exceptions=True)

    async def close(self) -> None:
        """Stop the watcher and loop, wait for a running sync step, close connections.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._integrity is not None:
                check, task = self._integrity
                check.cancel()  # interrupts a running quick_check, so close() never waits for one
                await asyncio.gather(task, return_exceptions=True)
            await self._scheduler.close()
            # before the connections: its warm-up may be reading
            await self._search.previous.close()
        finally:
            # Also when the steps above are cancelled: a second close() returns at once, so
            # this one is the only chance to close the files.
            # The searches' in-memory sign bits go with the index; a restart reloads them.
            index, self._index = self._index, None
            if index is not None:
                await asyncio.to_thread(index.close)

    @property
    def config(self) -> MemoryConfig:
        return self._config

    @config.setter
    def config(self, config: MemoryConfig) -> None:
        """Searches read the new settings from their next call on (benchmarks compare two)."""
        self._config = config
        self._search.config = config

    @property
    def sync_count(self) -> int:
        """Syncs finished since start."""
        return self._syncs.count

    @property
    def sign_index_bytes(self) -> int:
        """Memory the vector pre-filter's sign bits hold now (0 when closed)."""
        return self._index.signs.nbytes if self._index is not None else 0

    @property
    def facts(self) -> Facts:
        """The user's remembered facts (memory.facts), on this index's connections."""
        index = self._require_index()
        if index.facts is None:
            c = self.config
            index.facts = Facts(IndexSteps(index.conn, index.readers),
                                FactStore(c.facts_dedup_threshold, c.facts_max_chars,
                                          c.facts_max_per_user),
                                self._search.embeddings, self.embed_query, c.keyword_weight)
        return index.facts

    @property
    def episodes(self) -> Episodes:
        """Episodic memory (docs/memory.md, "Episodes"), on this index's connections."""
        index = self._require_index()
        if index.episodes is None:
            index.episodes = Episodes(IndexSteps(index.conn, index.readers), EpisodeStore(),
                                      self._search.embeddings, self.embed_query,
                                      self.config.keyword_weight)
        return index.episodes

    def _require_index(self) -> LiveIndex:
        if self._index is None:
            if self._swapping:
                raise MemoryUnavailable("memory index is being replaced after a failed "
                                        "integrity check")
            raise MemoryUnavailable("memory service is not started" if not self._closed
                                    else "memory service is closed")
        return self._index

    # --- syncing -------------------------------------------------------------------------

    def catch_up(self) -> None:
        """Schedule the full catch-up sync that ``start(catch_up=False)`` left out; returns at
        once."""
        if not self._closed:
            self._scheduler.run_soon()

    def nudge(self, path: Path | None = None) -> None:
        """Ask for a sync of ``path`` (or of everything) soon; returns at once, coalesces."""
        if self._closed:
            return
        self._scheduler.nudge(path)

    async def _scheduled_sync(self, paths: list[Path] | None) -> bool:
        try:
            await self._warmed.wait()  # the catch-up sync must not slow the load of the sign bits
            await self._run_sync(paths)
            return True
        except Exception as exc:
            # the loop must survive a bad sync (a cancel passes); the scheduler retries it
            self._syncs.last_error = f"sync failed: {type(exc).__name__}: {exc}"
            log.exception("memory.sync.failed")
            return False

    async def _run_sync(self, paths: list[Path] | None,
                        progress: ProgressCallback | None = None) -> SyncReport:
        async with self._sync_lock:
            index = self._require_index()
            self._syncs.syncing = True
            try:
                report = await index.indexer.sync(self._search.embeddings, paths=paths,
                                                  progress=progress)
            finally:
                self._syncs.syncing = False
                if self._index is not None:
                    await self._refresh_vector_state()
            self._syncs.record(report)
            return report

    async def sync_now(self, progress: ProgressCallback | None = None, *,
                       full: bool = False) -> SyncReport:
        """Sync every transcript now (waits for a running sync first); for tests and the CLI.

        ``full`` first forgets how far each transcript was read, so all are re-chunked
        (vectors still come from the embedding cache).
        """
        index = self._require_index()
        if full:
            await self._in_thread("queueing a full reindex", index.indexer.files.reset_files)
        return await self._run_sync(None, progress)

    async def reindex(self, full: bool = False, *, user: str | None = None) -> None:
        """Queue a sync of everything; ``full`` re-reads every transcript from the start (only
        ``user``'s when given: the others' files are unchanged, so the sync only looks at them)."""
        index = self._require_index()
        if full:
            await self._in_thread("queueing a full reindex", index.indexer.files.reset_files, user)
        self._scheduler.run_soon()

    async def delete_session(self, user: str, session_key: str) -> int:
        """Remove one session's rows at once (the transcript is the sessions package's)."""
        index = self._require_index()
        try:
            return await asyncio.to_thread(index.indexer.files.delete_session, user, session_key)
        except apsw.Error as exc:
            # The transcript is gone already; a full sync drops the rows once the disk recovers.
            log.warning("memory.delete_failed", session=session_key,
                        error=f"{type(exc).__name__}: {exc}",
                        effect="rows removed by the next sync")
            self.nudge()
            return 0

    async def sweep_retention(self, now_ms: int | None = None) -> dict[str, int]:
        """Remove chunks and facts older than ``retention_days`` (nothing when it is 0)."""
        cutoff = retention_cutoff_ms(self.config.retention_days, now_ms)
        if cutoff is None:
            return {"chunks": 0, "facts": 0, "episodes": 0}
        index = self._require_index()
        chunks = await self._in_thread("expiring chunks", index.indexer.files.prune_expired, cutoff)
        facts = await self.facts.prune_older_than(cutoff)
        episodes = await self.episodes.prune_older_than(cutoff)
        return {"chunks": chunks, "facts": facts, "episodes": episodes}

    async def forget(self, r: ForgetRange, *, record: bool) -> dict[str, int]:
        """``memory.forget``: drop the matching chunks and the facts the model saved from that
        conversation; ``record`` keeps the range so no later sync indexes it again (use it
        when the transcript keeps the messages)."""
        index = self._require_index()
        chunks = await self._in_thread("forgetting",
                                       lambda: index.indexer.files.forget(r, record=record))
        facts = await self.facts.forget_derived(r.user, r.session_key, r.after_ms, r.before_ms)
        episodes = await self.episodes.forget(r.user, r.session_key, r.after_ms, r.before_ms)
        log.info("memory.forget", session=r.session_key, chunks=chunks, facts=facts,
                 episodes=episodes, recorded=record)
        return {"chunks": chunks, "facts": facts, "episodes": episodes}

    async def _in_thread(self, action: str, fn: Callable[..., _T], *args: Any) -> _T:
        return await in_thread(action, fn, *args)

    async def _refresh_vector_state(self) -> None:
        """Recompute whether the vector leg may run, and who serves it during a rebuild."""
        await self._search.refresh(self._index, self._read)

    async def _read(self, fn: Callable[[apsw.Connection], _T]) -> _T:
        return await self._in_thread("reading the index", self._require_index().readers.run, fn)

    # --- reading -------------------------------------------------------------------------

    async def search(
        self,
        user: str,
        query: str,
        *,
        k: int | None = None,
        mode: str = "hybrid",
        session_key: str | None = None,
        exclude_session_key: str | None = None,
        after: str | None = None,
        before: str | None = None,
        now: datetime | None = None,
        recency: bool = False,
        shown: ShownHistory | None = None,
    ) -> SearchResponse:
        """Search ``user``'s memory; see ``memory.search`` for ranking and filters. ``now``
        (default: the clock) is the moment time phrases such as "last week" count back from;
        ``recency`` adds the recency term to a hybrid ranking (recall into a prompt does)."""
        request = SearchRequest.build(self.config, user, query, k=k, mode=mode,
                                      session_key=session_key,
                                      exclude_session_key=exclude_session_key, after=after,
                                      before=before, now=now, recency=recency, shown=shown)
        return await self._search.search(request, self._require_index())

    async def embed_query(self, text: str) -> list[float]:
        """The query vector of ``text``, from a small cache of recent queries when it is there."""
        return await self._search.embed_query(text)

    async def recall(self, user: str, message: str, *, k: int,
                     exclude_session_key: str | None = None, now: datetime | None = None,
                     shown: ShownHistory | None = None) -> list[SearchHit]:
        """What to put in a prompt answering ``message``: a hybrid search with the recency term
        (the conversation is happening now, and what was said last is usually what counts), then
        memory's rule for excerpts (:func:`memory.retrieval.excerpts.excerpts_for_prompt`).
        ``shown``: the prompt's own session and its history window, left out of the excerpts."""
        response = await self.search(user, message, k=k, mode="hybrid",
                                     exclude_session_key=exclude_session_key, now=now, recency=True,
                                     shown=shown)
        return await excerpts_for_prompt(
            response, message, self.config, floor=self._search.relevance_floor(response),
            shown=shown, around=lambda hit: self._read(lambda db: around_sqlite(db, user, hit)))

    async def context(self, user: str, message: str, run: RunMemory, *, k: int, shown: ShownHistory,
                      tz: tzinfo) -> MemoryContext:
        """What a prompt answering ``message`` gets from memory: recalled chunks (of every session
        but what ``shown``'s window holds), the facts most related, and episodes, as far as
        ``run`` turns each on; the rule both backends share
        (:func:`memory.context.gather_context`)."""
        return await gather_context(self, user, message, run, k=k, shown=shown, tz=tz)

    async def status(self, user: str | None = None) -> dict[str, Any]:
        """Counts and state, camelCase, ready for the wire.

        With ``user`` the counts are that user's rows only, and what describes the whole index
        (its path and size, the shared embedding cache, skipped files) is left out.
        """
        index = self._require_index()
        numbers = await self._in_thread("counting", index.readers.run,
                                        lambda db: count_rows(db, user))
        state: dict[str, Any] = {
            **numbers,
            "provider": self.embedder.provider if self.embedder else "none",
            "model": self.embedder.model_id if self.embedder else None,
            "dims": (self.embedder.dims or None) if self.embedder else None,
            "embedderReason": self.embedder_reason,
            "vectorBackend": {"available": index.backend.available, "reason": index.backend.reason},
            "vectorSearch": self._search.vector_status(numbers["embedded"], numbers["chunks"]),
            **self._syncs.wire(),
            "rebuiltFromTranscripts": index.rebuilt_reason or None,
            "scope": "all" if user is None else "user",
            "retention": {"days": self.config.retention_days, **self.retention_status},
        }
        if user is None:
            state.update({
                # Transcripts not indexed because they are symlinks or their header names another
                # user or session (memory.sqlite.index.sync); each is logged as memory.file_skipped.
                "skippedFiles": len(index.indexer.files.skipped),
                "dbBytes": await asyncio.to_thread(db_bytes, self.data_dir),
                "dbPath": os.fspath(self.db_path),
            })
        return state

    async def __aenter__(self) -> MemoryService:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
