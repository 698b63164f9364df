"""One sync, start to end: transcripts → chunks, then pending chunks → vectors.

The async half of indexing. Each blocking step (:class:`~memory.sync.FileSync`,
:class:`~memory.sqlite.index.vectors.VectorStore`) runs in a worker thread; only the embedder's
calls are awaited on the event loop. The caller (:class:`~memory.sqlite.service.MemoryService`)
never runs two syncs at once.

Pending chunks are read in batches of :data:`EMBED_ROWS_PER_BATCH` rows: cached vectors
first, the embedder only for the texts the cache lacks (deduplicated within the batch), and
the vectors of each embedder call committed (with the cached ones) before the next call, so
progress shows as it is made and an interrupted index resumes where it stopped, redoing at
most one call. An embedder failure leaves the rest pending (keyword-searchable) and is
reported; the next sync retries.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from memory.chunking import sha256_text
from memory.config import MemoryConfig
from memory.embedders.embeddings import EmbeddingPipeline
from memory.errors import EmbedderError
from memory.quantize import quantize_int8
from memory.reports import ProgressCallback, SyncProgress, SyncReport
from memory.sqlite.index.db import VectorBackend, WriteConnection
from memory.sqlite.index.sync import FileSync
from memory.sqlite.index.vectors import EmbedderIdentity, PendingRow, VectorStore

__all__ = ["EMBED_ROWS_PER_BATCH", "FILES_PER_BATCH", "Indexer", "ProgressCallback", "SyncProgress"]

log = structlog.get_logger("memory.indexer")

EMBED_ROWS_PER_BATCH = 256
# Transcripts synced per transaction and worker-thread hop (FileSync.sync_files), and the time
# after which a batch commits early so other writers (facts, deletes) never wait long on it.
FILES_PER_BATCH = 64
FILE_BATCH_S = 0.1


class Indexer:
    """Runs syncs over one index: ``files`` for the chunk rows, ``vectors`` for the rest."""

    def __init__(self, files: FileSync, vectors: VectorStore) -> None:
        self.files = files
        self.vectors = vectors

    @classmethod
    def on(cls, conn: WriteConnection, backend: VectorBackend, sessions_dir: Path,
           config: MemoryConfig, *, window: int | None = None) -> Indexer:
        """An indexer of the transcripts under ``sessions_dir`` writing through ``conn``;
        ``window`` is the embedder's input limit, which automatic chunk sizes fit."""
        vectors = VectorStore(conn, backend)
        return cls(FileSync(conn, sessions_dir, config, vectors, window=window), vectors)

    async def sync(self, pipeline: EmbeddingPipeline | None, *, paths: list[Path] | None = None,
                   progress: ProgressCallback | None = None) -> SyncReport:
        """One sync: given files (or all, forgetting vanished ones), then pending vectors."""
        started = time.perf_counter()
        report = SyncReport()
        identity = EmbedderIdentity.of(pipeline.embedder) if pipeline else None
        await asyncio.to_thread(self.vectors.prepare, identity)
        if paths is None:
            files = await asyncio.to_thread(self.files.list_transcripts)
            present = await asyncio.to_thread(lambda: {self.files.rel_path(p) for p in files})
            report.merge(await asyncio.to_thread(self.files.forget_missing, present))
        else:
            files = paths
        done = 0
        while done < len(files):
            batch, done = await asyncio.to_thread(self.files.sync_files, files, done,
                                                  max_files=FILES_PER_BATCH, max_s=FILE_BATCH_S)
            report.merge(batch)
            if progress is not None:
                progress(SyncProgress("files", done, len(files), report.chunks_written,
                                      report.embedded, 0))
        if pipeline is not None:
            pending_total = await asyncio.to_thread(self.vectors.pending_count)

            def embedded(n: int) -> None:
                if progress is not None:
                    progress(SyncProgress("embedding", len(files), len(files),
                                          report.chunks_written, n, max(0, pending_total - n)))
            try:
                await self.embed_pending(pipeline, report, embedded)
            except EmbedderError as exc:
                report.error = f"embedder: {exc}"
                log.warning("memory.embed.failed", error=str(exc), retryable=exc.retryable,
                            effect="chunks stay pending (keyword-searchable); retried next sync")
        report.pending = await asyncio.to_thread(self.vectors.pending_count)
        report.duration_ms = (time.perf_counter() - started) * 1000
        return report

    async def embed_pending(self, pipeline: EmbeddingPipeline, report: SyncReport,
                            progress: Callable[[int], None] | None = None) -> None:
        """Embed every pending chunk, batch by batch; raises EmbedderError, leaving the rest
        pending."""
        vectors = self.vectors
        if not vectors.backend.available:
            return
        identity = EmbedderIdentity.of(pipeline.embedder)
        while True:
            rows = await asyncio.to_thread(vectors.pending_rows, EMBED_ROWS_PER_BATCH)
            if not rows:
                await asyncio.to_thread(vectors.rebuild_done)
                return
            sent = [pipeline.text_to_send(r[1]) for r in rows]
            hashes = [sha256_text(t) for t in sent]
            found = await asyncio.to_thread(vectors.cached, identity, hashes)
            report.cache_hits += sum(1 for h in hashes if h in found)
            misses: dict[str, str] = {}
            for h, text in zip(hashes, sent):
                if h not in found:
                    misses.setdefault(h, text)
            # Shortest first, so that each call holds texts of similar length: a local model pads
            # a batch to its longest text (on the quick benchmark's chunks, calls of 16 padded
            # 19% of their tokens in fetch order, 9% sorted).
            miss_hashes = sorted(misses, key=lambda h: len(misses[h]))
            waiting = list(range(len(rows)))  # rows whose vector is not stored yet
            done = 0
            for batch in pipeline.batches([misses[h] for h in miss_hashes]):
                report.embedder_calls += 1
                result = await pipeline.embed_batch(batch)
                fresh = set(miss_hashes[done:done + len(batch)])
                for h, vec in zip(miss_hashes[done:done + len(batch)], result):
                    found[h] = (len(vec), quantize_int8(vec))
                done += len(batch)
                # Committed per embedder call, not per fetch of rows: a local model takes ~10 s
                # for a fetch, in which nothing would show as embedded, nor survive a stop.
                waiting = await self._store_ready(identity, rows, hashes, found, fresh, waiting,
                                                  report, progress)
            if waiting:  # every vector came from the cache
                await self._store_ready(identity, rows, hashes, found, set(), waiting, report,
                                        progress)

    async def _store_ready(self, identity: EmbedderIdentity, rows: list[PendingRow],
                           hashes: list[str], found: dict[str, tuple[int, bytes]], fresh: set[str],
                           waiting: list[int], report: SyncReport,
                           progress: Callable[[int], None] | None) -> list[int]:
        """Store the ``waiting`` rows whose vector is now known (cached or just embedded, the
        ``fresh`` ones cached with them) in one transaction; returns the rows still waiting."""
        ready = [i for i in waiting if hashes[i] in found]
        if ready:
            report.embedded += await asyncio.to_thread(self.vectors.store, identity,
                                                       [rows[i] for i in ready],
                                                       [hashes[i] for i in ready], found, fresh)
            if progress is not None:
                progress(report.embedded)
        return [i for i in waiting if hashes[i] not in found]
