"""``MemoryService``: the async facade the gateway and the CLI use.

One writer (``IndexWriter``) on its own connection, used by one worker thread at a time;
searches on pooled read connections in worker threads (WAL lets them read while the writer
writes), so neither a search nor a sync ever blocks the event loop, and a search never waits
for a sync.

Sync triggers: ``start()`` runs a catch-up sync at once; ``watchfiles`` on the sessions dir
and ``nudge()`` (the gateway calls it after ``chat.final``) mark paths dirty and wake the
debounce loop, which waits until nothing new arrived for ``debounce_ms`` (at most
``_MAX_DEBOUNCE_FACTOR`` × that under a steady stream) and then runs one sync for everything
marked. Syncs never overlap (one loop, one lock).
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import apsw
import structlog

from memory.config import MemoryConfig
from memory.db import DEFAULT_VEC_EXTENSION, VectorBackend, open_index, vector_to_blob
from memory.embeddings import Embedder, EmbeddingPipeline
from memory.errors import EmbedderError, MemoryStorageError, MemoryUnavailable
from memory.indexer import EmbedderIdentity, IndexWriter, SyncProgress, SyncReport
from memory.search import HybridSearch, SearchRequest, SearchResponse

__all__ = ["MemoryService"]

log = structlog.get_logger("memory.service")

DB_NAME = "memory.db"
_MAX_DEBOUNCE_FACTOR = 10


class MemoryService:
    def __init__(
        self,
        data_dir: Path,
        config: MemoryConfig,
        embedder: Embedder | None,
        *,
        embedder_reason: str = "",
        vec_extension: str | None = DEFAULT_VEC_EXTENSION,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.sessions_dir = self.data_dir / "sessions"
        self.db_path = self.data_dir / DB_NAME
        self.config = config
        self.embedder = embedder
        self.embedder_reason = embedder_reason
        self._vec_extension = vec_extension
        self._pipeline = EmbeddingPipeline.from_config(embedder, config) if embedder else None
        self._identity = EmbedderIdentity.of(embedder) if embedder else None
        self._writer: IndexWriter | None = None
        self._vectors = VectorBackend(False, "not started")
        self._rebuilt_reason = ""
        self._readers: queue.SimpleQueue[apsw.Connection] = queue.SimpleQueue()
        # Held while a reader is handed back and while close() drains the pool, so a search
        # finishing during close() cannot put its connection back after the drain (a leak).
        self._readers_lock = threading.Lock()
        self._vector_state: tuple[bool, str] = (False, "not started")
        self._sync_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._immediate = False
        self._dirty_all = False
        self._dirty: set[Path] = set()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._syncing = False
        self.sync_count = 0
        self._last_sync: str | None = None
        self._last_report: SyncReport | None = None
        self._last_error: str | None = None

    # --- life cycle ----------------------------------------------------------------------

    async def start(self, *, catch_up: bool = True) -> None:
        """Open the index, schedule the catch-up sync, start the watcher and debounce loop.

        ``catch_up=False`` leaves the first sync to the caller (the CLI runs it with a
        progress bar through :meth:`sync_now`).
        """
        if self._writer is not None:
            return
        if self._closed:
            raise MemoryUnavailable("memory service is closed")
        self.sessions_dir.mkdir(parents=True, exist_ok=True)
        missing = not await asyncio.to_thread(self.db_path.exists)
        opened = await asyncio.to_thread(open_index, self.db_path, vec_extension=self._vec_extension)
        self._vectors = opened.vectors
        self._rebuilt_reason = opened.rebuilt_reason
        if missing and await asyncio.to_thread(self._has_transcripts):
            # A deleted index is rebuilt like a corrupt one, and is reported like one.
            self._rebuilt_reason = f"{DB_NAME} was missing; rebuilt from transcripts"
            log.warning("memory.db.missing", path=str(self.db_path), effect="index rebuilt from transcripts")
        self._writer = IndexWriter(opened.db, self.sessions_dir, self.config, opened.vectors)
        self._vector_state = await asyncio.to_thread(self._compute_vector_state)
        log.info("memory.started", db=str(self.db_path), provider=self.embedder.provider if self.embedder else None,
                 vector_backend=self._vectors.reason, embedder_reason=self.embedder_reason)
        self._tasks.append(asyncio.create_task(self._debounce_loop(), name="memory-debounce"))
        if self.config.watch:
            self._tasks.append(asyncio.create_task(self._watch(), name="memory-watch"))
        if catch_up:
            self._dirty_all = True
            self._immediate = True
            self._wake.set()

    async def wait_idle(self) -> None:
        """Return once no sync is queued or running (tests, the CLI after ``start``)."""
        self._require_writer()
        while True:
            await self._idle.wait()
            await asyncio.sleep(0)
            if self._idle.is_set() and not self._wake.is_set():
                return

    async def close(self) -> None:
        """Stop the watcher and loop, wait for a running sync step, close connections. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
            except Exception:
                log.exception("memory.task.failed_on_close", task=task.get_name())
        writer, self._writer = self._writer, None
        await asyncio.to_thread(self._close_connections, writer)

    def _close_connections(self, writer: IndexWriter | None) -> None:
        # Readers first: only a read-write connection closing last checkpoints the WAL into
        # memory.db and removes it, leaving one self-contained file after a clean stop.
        with self._readers_lock:
            while True:
                try:
                    self._readers.get_nowait().close()
                except queue.Empty:
                    break
        if writer is not None:
            with writer.lock:  # a to_thread step of a cancelled sync may still be running
                writer.db.close()

    def _db_bytes(self) -> int:
        """memory.db with its -wal and -shm (files moved aside as corrupt are not counted)."""
        return sum(p.stat().st_size for p in self.data_dir.glob(DB_NAME + "*") if p.is_file()
                   and ".corrupt-" not in p.name)

    def _has_transcripts(self) -> bool:
        return next(self.sessions_dir.glob("*/*.jsonl"), None) is not None

    def _require_writer(self) -> IndexWriter:
        if self._writer is None:
            raise MemoryUnavailable("memory service is not started" if not self._closed else "memory service is closed")
        return self._writer

    # --- syncing -------------------------------------------------------------------------

    def nudge(self, path: Path | None = None) -> None:
        """Ask for a sync of ``path`` (or of everything) soon; returns at once, coalesces."""
        if self._closed:
            return
        if path is None:
            self._dirty_all = True
        else:
            self._dirty.add(Path(path))
        self._idle.clear()
        self._wake.set()

    async def _debounce_loop(self) -> None:
        loop = asyncio.get_running_loop()
        quiet = self.config.debounce_ms / 1000
        while True:
            if not self._wake.is_set():
                self._idle.set()
            await self._wake.wait()
            self._idle.clear()
            self._wake.clear()
            if not self._immediate:
                deadline = loop.time() + quiet * _MAX_DEBOUNCE_FACTOR
                while True:
                    wait = min(quiet, deadline - loop.time())
                    if wait <= 0:
                        break
                    try:
                        async with asyncio.timeout(wait):
                            await self._wake.wait()
                    except TimeoutError:
                        break
                    self._wake.clear()
            self._immediate = False
            paths = None if self._dirty_all else sorted(self._dirty)
            self._dirty_all = False
            self._dirty = set()
            try:
                await self._run_sync(paths)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the loop must survive a bad sync; the next nudge retries
                self._last_error = f"sync failed: {type(exc).__name__}: {exc}"
                log.exception("memory.sync.failed")

    async def _watch(self) -> None:
        import watchfiles

        def only_transcripts(_change: watchfiles.Change, path: str) -> bool:
            return path.endswith(".jsonl")

        try:
            async for changes in watchfiles.awatch(self.sessions_dir, stop_event=self._stop,
                                                   watch_filter=only_transcripts, debounce=100,
                                                   recursive=True):
                for _change, path in changes:
                    self.nudge(Path(path))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("memory.watch.stopped", error=str(exc), effect="index follows nudges only")

    async def _run_sync(self, paths: list[Path] | None,
                        progress: Callable[[SyncProgress], None] | None = None) -> SyncReport:
        async with self._sync_lock:
            writer = self._require_writer()
            self._syncing = True
            try:
                report = await writer.sync(self._pipeline, paths=paths, progress=progress)
            finally:
                self._syncing = False
                if self._writer is not None:
                    self._vector_state = await asyncio.to_thread(self._compute_vector_state)
            self.sync_count += 1
            self._last_sync = datetime.now(UTC).isoformat()
            self._last_report = report
            self._last_error = report.error
            if report.files_changed or report.files_deleted or report.embedded or report.error:
                log.info("memory.sync", files=report.files_scanned, changed=report.files_changed,
                         deleted=report.files_deleted, chunks=report.chunks_written,
                         embedded=report.embedded, cache_hits=report.cache_hits, pending=report.pending,
                         ms=round(report.duration_ms, 1), error=report.error)
            return report

    async def sync_now(self, progress: Callable[[SyncProgress], None] | None = None, *,
                       full: bool = False) -> SyncReport:
        """Sync every transcript now (waits for a running sync first); for tests and the CLI.

        ``full`` first forgets how far each transcript was read, so all are re-chunked
        (vectors still come from the embedding cache).
        """
        writer = self._require_writer()
        if full:
            await self._in_thread("queueing a full reindex", writer.reset_files)
        return await self._run_sync(None, progress)

    async def reindex(self, full: bool = False) -> None:
        """Queue a sync of everything; ``full`` re-reads every transcript from the start."""
        writer = self._require_writer()
        if full:
            await self._in_thread("queueing a full reindex", writer.reset_files)
        self._dirty_all = True
        self._immediate = True
        self._idle.clear()
        self._wake.set()

    async def delete_session(self, user: str, session_key: str) -> int:
        """Remove one session's rows at once (the transcript is the sessions package's)."""
        writer = self._require_writer()
        try:
            return int(await asyncio.to_thread(writer.delete_session, user, session_key))
        except apsw.Error as exc:
            # The transcript is gone already; a full sync drops the rows once the disk recovers.
            log.warning("memory.delete_failed", session=session_key, error=f"{type(exc).__name__}: {exc}",
                        effect="rows removed by the next sync")
            self.nudge()
            return 0

    async def _in_thread(self, action: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run blocking index work off the loop; a SQLite failure (disk full, I/O) becomes
        MemoryStorageError, which the gateway answers as a storage error, not a crash."""
        try:
            return await asyncio.to_thread(fn, *args)
        except apsw.Error as exc:
            raise MemoryStorageError(f"memory index failed while {action}: {type(exc).__name__}") from exc

    def _compute_vector_state(self) -> tuple[bool, str]:
        writer = self._writer
        if writer is None:
            return False, "not started"
        if self._identity is None:
            return False, f"no embedder ({self.embedder_reason})" if self.embedder_reason else "no embedder"
        return writer.vector_state(self._identity)

    # --- reading -------------------------------------------------------------------------

    def _with_reader(self, fn: Callable[[apsw.Connection], Any]) -> Any:
        try:
            db = self._readers.get_nowait()
        except queue.Empty:
            ext = self._vec_extension if self._vectors.available else None
            db = open_index(self.db_path, vec_extension=ext, readonly=True).db
        try:
            return fn(db)
        finally:
            with self._readers_lock:
                if self._closed:
                    db.close()
                else:
                    self._readers.put(db)

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
    ) -> SearchResponse:
        """Search ``user``'s memory; see ``memory.search`` for ranking and filters."""
        request = SearchRequest.build(self.config, user, query, k=k, mode=mode, session_key=session_key,
                                      exclude_session_key=exclude_session_key, after=after, before=before)
        self._require_writer()
        started = time.perf_counter()
        actual = request.mode
        fallback: str | None = None
        blob: bytes | None = None
        if request.mode != "keyword":
            ready, why = self._vector_state
            if ready and self._pipeline is not None:
                try:
                    blob = vector_to_blob(await self._pipeline.embed_query(request.query))
                except EmbedderError as exc:
                    ready, why = False, f"query embedding failed: {exc}"
            if blob is None:
                actual, fallback = "keyword", why
        embedded_at = time.perf_counter()
        searcher = lambda db: HybridSearch(db, self.config).search(  # noqa: E731
            request, query_vector=blob, keyword=actual != "vector")
        hits = await self._in_thread("searching", self._with_reader, searcher)
        done = time.perf_counter()
        return SearchResponse(hits, actual, fallback, {
            "embedMs": round((embedded_at - started) * 1000, 2), "searchMs": round((done - embedded_at) * 1000, 2)})

    async def status(self) -> dict[str, Any]:
        """Counts and state, camelCase, ready for the wire."""
        self._require_writer()

        def counts(db: apsw.Connection) -> dict[str, int]:
            def q(sql: str) -> int:
                row = db.execute(sql).fetchone()
                return int(row[0]) if row is not None else 0

            return {
                "files": q("SELECT count(*) FROM files"),
                "chunks": q("SELECT count(*) FROM chunks"),
                "embedded": q("SELECT count(*) FROM chunks WHERE embedded = 1"),
                "pending": q("SELECT count(*) FROM chunks WHERE embedded = 0"),
                "cacheEntries": q("SELECT count(*) FROM embedding_cache"),
            }

        numbers = await self._in_thread("counting", self._with_reader, counts)
        ready, why = self._vector_state
        size = await asyncio.to_thread(self._db_bytes)
        report = self._last_report
        return {
            **numbers,
            "provider": self.embedder.provider if self.embedder else "none",
            "model": self.embedder.model_id if self.embedder else None,
            "dims": (self.embedder.dims or None) if self.embedder else None,
            "embedderReason": self.embedder_reason,
            "vectorBackend": {"available": self._vectors.available, "reason": self._vectors.reason},
            "vectorSearch": {"ready": ready, "reason": why or None},
            "syncing": self._syncing,
            "syncCount": self.sync_count,
            "lastSync": self._last_sync,
            "lastSyncMs": round(report.duration_ms, 1) if report else None,
            "lastError": self._last_error,
            "rebuiltFromTranscripts": self._rebuilt_reason or None,
            "dbBytes": size,
            "dbPath": os.fspath(self.db_path),
        }

    async def __aenter__(self) -> MemoryService:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
