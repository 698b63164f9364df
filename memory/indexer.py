"""The one writer: transcripts → chunks (+ FTS rows) → vectors (via the cache).

Incremental algorithm (per file, one transaction each):

1. ``stat``; (size, mtime) unchanged and chunk settings unchanged → nothing to do.
2. The indexed prefix is fingerprinted by sha256 of its first and last 4 KiB plus its length.
   If the file is shorter than the indexed offset, or the fingerprint differs, the file was
   rewritten or truncated → its rows are deleted and it is indexed whole.
3. Otherwise only the tail is read: from the byte offset of the *last* chunk's first line
   (chunks before it are closed — see ``memory.chunking``), re-packed, and compared by index
   with the stored chunks: identical chunks stay, changed/new ones are written. Cost is the
   last chunk plus the new text.
4. A file that disappeared loses its rows.

Vectors: after the file pass, chunks with ``embedded = 0`` are embedded in batches — cached
vectors first (the cache holds int8, ``chunks_vec`` the sign bits, ``chunks.vector_hash`` the
cache key for the search's exact re-rank), the embedder only for texts never seen under this embedder identity — and each
batch is committed, so an interrupted index resumes where it stopped. An embedder failure
leaves the rest pending (keyword-searchable) and is reported; the next sync retries.

Embedder change: the identity (provider, model, endpoint hash) is kept in ``meta``. When it
differs, one transaction drops ``chunks_vec``, marks every chunk pending and sets
``meta.vector_rebuild``; until the pending count reaches zero the vector leg reports itself
unavailable (hybrid search falls back to keyword and says why), so no search ever mixes two
models' vectors. Rebuilding reuses the cache, so switching back costs no embedder calls.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import apsw
import structlog

from memory.chunking import Chunk, chunk_messages, fts_text, sha256_text
from memory.config import MemoryConfig
from memory.db import (
    VectorBackend,
    cached_vector_to_int8,
    drop_vector_table,
    ensure_vector_table,
    get_meta,
    quantize_int8,
    set_meta,
    vector_format,
    vector_table_dims,
)
from memory.embeddings import Embedder, EmbeddingPipeline
from memory.errors import EmbedderError
from memory.transcripts import iso_to_ms, read_messages, session_of

__all__ = ["EmbedderIdentity", "IndexWriter", "SyncProgress", "SyncReport", "chunking_fingerprint"]

log = structlog.get_logger("memory.indexer")

_FINGERPRINT_BYTES = 4096
EMBED_ROWS_PER_BATCH = 256
_NEVER = 2**62


def chunking_fingerprint(config: MemoryConfig) -> str:
    return f"v1:{config.chunk_tokens}:{config.overlap_tokens}"


@dataclass(frozen=True, slots=True)
class EmbedderIdentity:
    provider: str
    model: str
    endpoint_hash: str

    @classmethod
    def of(cls, embedder: Embedder) -> EmbedderIdentity:
        return cls(embedder.provider, embedder.model_id, embedder.endpoint_hash)

    def to_json(self) -> str:
        return json.dumps([self.provider, self.model, self.endpoint_hash])


@dataclass(slots=True)
class SyncReport:
    """What one sync did."""

    files_scanned: int = 0
    files_changed: int = 0
    files_deleted: int = 0
    chunks_written: int = 0
    chunks_deleted: int = 0
    embedded: int = 0
    cache_hits: int = 0
    embedder_calls: int = 0
    pending: int = 0
    error: str | None = None
    duration_ms: float = 0.0

    def merge(self, other: SyncReport) -> None:
        for name in ("files_scanned", "files_changed", "files_deleted", "chunks_written",
                     "chunks_deleted", "embedded", "cache_hits", "embedder_calls"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass(frozen=True, slots=True)
class SyncProgress:
    """Passed to a progress callback (on the event loop) after each file and each batch."""

    phase: str            # "files" | "embedding"
    files_done: int
    files_total: int
    chunks_written: int
    embedded: int
    pending: int


ProgressCallback = Callable[[SyncProgress], None]


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _prefix_fingerprint(path: Path, length: int) -> str:
    digest = hashlib.sha256(str(length).encode())
    with path.open("rb") as fh:
        digest.update(fh.read(min(length, _FINGERPRINT_BYTES)))
        if length > _FINGERPRINT_BYTES:
            fh.seek(max(_FINGERPRINT_BYTES, length - _FINGERPRINT_BYTES))
            digest.update(fh.read(length - fh.tell()))
    return digest.hexdigest()


@dataclass(slots=True)
class _FileRow:
    size: int
    mtime_ns: int
    hash: str
    indexed_offset: int
    indexed_lines: int
    chunking: str


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _locked(method: Callable[Concatenate[IndexWriter, _P], _R]) -> Callable[Concatenate[IndexWriter, _P], _R]:
    """Serialise use of the writing connection: a transaction never interleaves with another."""

    def wrapper(self: IndexWriter, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self.lock:
            return method(self, *args, **kwargs)

    return functools.update_wrapper(wrapper, method)  # type: ignore[return-value]


class IndexWriter:
    """Owns the writing connection. Its blocking methods run on one worker thread at a time
    (the service never overlaps syncs); ``embed_pending`` is async and hops to threads."""

    def __init__(self, db: apsw.Connection, sessions_dir: Path, config: MemoryConfig,
                 vectors: VectorBackend) -> None:
        self.db = db
        self.sessions_dir = sessions_dir
        self._resolved_root = sessions_dir.resolve()
        self.config = config
        self.vectors = vectors
        self.chunking = chunking_fingerprint(config)
        self.lock = threading.RLock()

    # --- files -------------------------------------------------------------------------

    def rel_path(self, path: Path) -> str:
        # Paths from our own scan sit under sessions_dir as given, so no system call is
        # needed (resolve() per file made a 100k-file scan take most of a second); paths from
        # the watcher or a nudge may come spelled otherwise and are resolved.
        try:
            rel = path.relative_to(self.sessions_dir)
            if ".." not in rel.parts:
                return rel.as_posix()
        except ValueError:
            pass
        return path.resolve().relative_to(self._resolved_root).as_posix()

    def list_transcripts(self) -> list[Path]:
        if not self.sessions_dir.is_dir():
            return []
        return sorted(p for p in self.sessions_dir.glob("*/*.jsonl") if p.is_file())

    def _file_row(self, rel: str) -> _FileRow | None:
        row = self.db.execute(
            "SELECT size, mtime_ns, hash, indexed_offset, indexed_lines, chunking FROM files WHERE path = ?",
            (rel,),
        ).fetchone()
        return None if row is None else _FileRow(*row)

    @_locked
    def sync_file(self, path: Path) -> SyncReport:
        """Bring one transcript's rows in step with the file (see the module docstring)."""
        report = SyncReport(files_scanned=1)
        rel = self.rel_path(path)
        owner = session_of(rel)
        if owner is None:
            return report
        try:
            st = path.stat()
        except FileNotFoundError:
            with self.db:
                report.chunks_deleted = self._delete_path(rel)
                deleted = self.db.changes()
            report.files_deleted = 1 if deleted or report.chunks_deleted else 0
            return report
        row = self._file_row(rel)
        if row and row.chunking == self.chunking and (row.size, row.mtime_ns) == (st.st_size, st.st_mtime_ns):
            return report
        incremental = (
            row is not None
            and row.chunking == self.chunking
            and st.st_size >= row.indexed_offset
            and _prefix_fingerprint(path, row.indexed_offset) == row.hash
        )
        with self.db:
            if incremental:
                assert row is not None
                written, deleted, end_offset, end_line = self._index_tail(path, rel, owner, row)
            else:
                deleted = self._delete_path(rel)
                written, _, end_offset, end_line = self._index_from(path, rel, owner, 0, 1, 0, 0)
            self.db.execute(
                """
                INSERT INTO files(path, user, session_key, size, mtime_ns, hash, indexed_offset,
                                  indexed_lines, chunking, indexed_at)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT(path) DO UPDATE SET
                    size = excluded.size, mtime_ns = excluded.mtime_ns, hash = excluded.hash,
                    indexed_offset = excluded.indexed_offset, indexed_lines = excluded.indexed_lines,
                    chunking = excluded.chunking, indexed_at = excluded.indexed_at
                """,
                (rel, owner[0], owner[1], st.st_size, st.st_mtime_ns,
                 _prefix_fingerprint(path, end_offset), end_offset, end_line, self.chunking, _now()),
            )
        report.files_changed = 1 if (written or deleted or row is None or not incremental) else 0
        report.chunks_written, report.chunks_deleted = written, deleted
        return report

    def _index_tail(self, path: Path, rel: str, owner: tuple[str, str], row: _FileRow) -> tuple[int, int, int, int]:
        last = self.db.execute(
            "SELECT chunk_idx, byte_start, line_start, seg_start FROM chunks WHERE path = ? "
            "ORDER BY chunk_idx DESC LIMIT 1",
            (rel,),
        ).fetchone()
        if last is None:
            return self._index_from(path, rel, owner, row.indexed_offset, row.indexed_lines + 1, 0, 0,
                                    known_end=row.indexed_offset)
        idx, byte_start, line_start, seg_start = last
        return self._index_from(path, rel, owner, byte_start, line_start, idx, seg_start,
                                known_end=row.indexed_offset)

    def _index_from(self, path: Path, rel: str, owner: tuple[str, str], offset: int, line: int,
                    first_idx: int, skip_segments: int, known_end: int | None = None) -> tuple[int, int, int, int]:
        result = read_messages(path, offset, line)
        if known_end is not None and result.end_offset == known_end:
            # Nothing complete was appended (maybe a partial line): the stored chunks stand.
            return 0, 0, result.end_offset, result.end_line
        chunks = chunk_messages(result.messages, self.config.chunk_tokens, self.config.overlap_tokens,
                                first_idx=first_idx, skip_segments=skip_segments)
        written, deleted = self._replace_chunks(rel, owner, first_idx, chunks)
        return written, deleted, result.end_offset, result.end_line

    def _replace_chunks(self, rel: str, owner: tuple[str, str], first_idx: int, chunks: list[Chunk]) -> tuple[int, int]:
        existing = {
            idx: (cid, chash, ls, le)
            for cid, idx, chash, ls, le in self.db.execute(
                "SELECT id, chunk_idx, content_hash, line_start, line_end FROM chunks "
                "WHERE path = ? AND chunk_idx >= ?",
                (rel, first_idx),
            )
        }
        written = deleted = 0
        stale: list[int] = []
        for chunk in chunks:
            old = existing.pop(chunk.idx, None)
            if old is not None and old[1:] == (chunk.content_hash, chunk.line_start, chunk.line_end):
                continue
            if old is not None:
                stale.append(old[0])
            if stale:
                deleted += self._delete_ids(stale)
                stale = []
            self._insert_chunk(rel, owner, chunk)
            written += 1
        deleted += self._delete_ids([v[0] for v in existing.values()])
        return written, deleted

    def _insert_chunk(self, rel: str, owner: tuple[str, str], chunk: Chunk) -> None:
        self.db.execute(
            """
            INSERT INTO chunks(path, user, session_key, chunk_idx, content, line_start, line_end,
                               seg_start, byte_start, start_ts, end_ts, start_ms, end_ms,
                               content_hash, embedded)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)
            """,
            (rel, owner[0], owner[1], chunk.idx, chunk.content, chunk.line_start, chunk.line_end,
             chunk.seg_start, chunk.byte_start, chunk.start_ts, chunk.end_ts,
             iso_to_ms(chunk.start_ts), iso_to_ms(chunk.end_ts), chunk.content_hash),
        )
        chunk_id = self.db.last_insert_rowid()
        self.db.execute("INSERT INTO chunks_fts(rowid, body) VALUES (?, ?)", (chunk_id, fts_text(chunk.content)))

    def _delete_ids(self, ids: list[int]) -> int:
        if not ids:
            return 0
        has_vec = self._vector_table_usable()
        if not self.vectors.available:
            # Cannot touch chunks_vec without the module: rebuild vectors once it loads again.
            set_meta(self.db, "vectors_stale", "1")
        for cid in ids:
            self.db.execute("DELETE FROM chunks_fts WHERE rowid = ?", (cid,))
            if has_vec:
                self.db.execute("DELETE FROM chunks_vec WHERE chunk_id = ?", (cid,))
            self.db.execute("DELETE FROM chunks WHERE id = ?", (cid,))
        return len(ids)

    def _delete_path(self, rel: str) -> int:
        ids = [r[0] for r in self.db.execute("SELECT id FROM chunks WHERE path = ?", (rel,))]
        n = self._delete_ids(ids)
        self.db.execute("DELETE FROM files WHERE path = ?", (rel,))
        return n

    def _vector_table_usable(self) -> bool:
        return self.vectors.available and vector_table_dims(self.db) is not None

    @_locked
    def delete_session(self, user: str, session_key: str) -> int:
        """Remove every row of one session at once; returns the chunks removed."""
        rel = f"{user}/{session_key}.jsonl"
        if session_of(rel) is None or "/" in session_key or user in (".", ".."):
            return 0
        with self.db:
            removed = self._delete_path(rel)
        return removed

    @_locked
    def forget_missing(self, present: set[str]) -> SyncReport:
        """Delete rows of indexed files no longer on disk."""
        report = SyncReport()
        gone = [r[0] for r in self.db.execute("SELECT path FROM files") if r[0] not in present]
        for rel in gone:
            with self.db:
                report.chunks_deleted += self._delete_path(rel)
            report.files_deleted += 1
        return report

    @_locked
    def reset_files(self) -> None:
        """Forget every file's offset so the next sync re-reads all transcripts (``reindex full``).

        Rows stay until each file is re-indexed (in its own transaction), so search keeps
        working throughout. Each file's chunks are then deleted and written anew (step 2 of
        the module docstring); their vectors come back from the embedding cache.
        """
        with self.db:
            self.db.execute("UPDATE files SET size = -1, hash = '', chunking = 'reset'")

    # --- vectors -----------------------------------------------------------------------

    @_locked
    def prepare_vectors(self, identity: EmbedderIdentity | None) -> None:
        """Align stored vectors with the current embedder identity (see the module docstring)."""
        if not self.vectors.available:
            return
        with self.db:
            if get_meta(self.db, "vectors_stale") == "1":
                self._start_vector_rebuild()
                set_meta(self.db, "vectors_stale", None)
            if identity is None:
                return
            stored = get_meta(self.db, "embedder")
            if stored != identity.to_json():
                if stored is not None:
                    log.warning("memory.embedder.changed", old=stored, new=identity.to_json(),
                                effect="vectors rebuilt from cache/embedder; hybrid is keyword-only until done")
                self._start_vector_rebuild()
                set_meta(self.db, "embedder", identity.to_json())

    def _start_vector_rebuild(self) -> None:
        """Drop every vector and mark every chunk pending (caller's transaction)."""
        drop_vector_table(self.db)
        self.db.execute("UPDATE chunks SET embedded = 0 WHERE embedded = 1")
        set_meta(self.db, "vector_rebuild", "1")

    @_locked
    def vector_state(self, identity: EmbedderIdentity | None) -> tuple[bool, str]:
        """Whether the vector leg may run for ``identity`` now, and if not, why."""
        if not self.vectors.available:
            return False, self.vectors.reason
        if identity is None:
            return False, "no embedder"
        if get_meta(self.db, "embedder") != identity.to_json():
            return False, "vectors not built yet for this embedder"
        if get_meta(self.db, "vector_rebuild") is not None:
            return False, f"vectors being rebuilt for a new embedder ({self.pending_count()} chunks to go)"
        if vector_table_dims(self.db) is None:
            return False, "no vectors indexed yet"
        return True, ""

    @_locked
    def pending_count(self) -> int:
        (n,) = self.db.execute("SELECT count(*) FROM chunks WHERE embedded = 0").fetchone() or (0,)
        return int(n)

    @_locked
    def _pending_rows(self, limit: int) -> list[tuple[Any, ...]]:
        return list(self.db.execute(
            "SELECT id, content, user, session_key, start_ms, end_ms, content_hash FROM chunks "
            "WHERE embedded = 0 ORDER BY id LIMIT ?",
            (limit,),
        ))

    @_locked
    def _cached(self, identity: EmbedderIdentity, hashes: list[str]) -> dict[str, tuple[int, bytes]]:
        found: dict[str, tuple[int, bytes]] = {}
        for h in set(hashes):
            row = self.db.execute(
                "SELECT dims, vector FROM embedding_cache WHERE provider = ? AND model = ? "
                "AND endpoint_hash = ? AND content_hash = ?",
                (identity.provider, identity.model, identity.endpoint_hash, h),
            ).fetchone()
            if row is not None:
                found[h] = (int(row[0]), cached_vector_to_int8(bytes(row[1]), int(row[0])))
        return found

    @_locked
    def _store(self, identity: EmbedderIdentity, rows: list[tuple[Any, ...]], hashes: list[str],
               vectors: dict[str, tuple[int, bytes]], fresh: set[str]) -> int:
        with self.db:
            now = _now()
            for h in fresh:
                dims, blob = vectors[h]
                self.db.execute(
                    "INSERT OR IGNORE INTO embedding_cache(provider, model, endpoint_hash, content_hash, "
                    "dims, vector, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (identity.provider, identity.model, identity.endpoint_hash, h, dims, blob, now),
                )
            dims_seen = {vectors[h][0] for h in hashes}
            if len(dims_seen) != 1:
                raise EmbedderError(f"embedder returned mixed widths {sorted(dims_seen)}", retryable=False)
            dims = dims_seen.pop()
            ensure_vector_table(self.db, dims)
            quantize_sql = "vec_quantize_binary(vec_int8(?))" if vector_format(dims) == "bit" else "vec_int8(?)"
            stored = 0
            for (cid, _content, user, session_key, start_ms, end_ms, chash), h in zip(rows, hashes):
                if self.db.execute("SELECT 1 FROM chunks WHERE id = ? AND embedded = 0", (cid,)).fetchone() is None:
                    continue  # deleted or replaced while its vector was being made
                stored += 1
                self.db.execute("DELETE FROM chunks_vec WHERE chunk_id = ?", (cid,))
                self.db.execute(
                    f"INSERT INTO chunks_vec(chunk_id, user, embedding, session_key, start_ms, end_ms) "
                    f"VALUES (?, ?, {quantize_sql}, ?, ?, ?)",
                    # A chunk without timestamps must fail every time filter, as NULL does in SQL.
                    (cid, user, vectors[h][1], session_key,
                     _NEVER if start_ms is None else start_ms, -1 if end_ms is None else end_ms),
                )
                # vector_hash is stored only when the text sent differs from the chunk (redaction).
                self.db.execute("UPDATE chunks SET embedded = 1, vector_hash = ? WHERE id = ?",
                                (None if h == chash else h, cid))
            if self.db.execute("SELECT 1 FROM chunks WHERE embedded = 0 LIMIT 1").fetchone() is None:
                set_meta(self.db, "vector_rebuild", None)
        return stored

    @_locked
    def _rebuild_done(self) -> None:
        with self.db:
            if get_meta(self.db, "vector_rebuild") is not None and self.pending_count() == 0:
                set_meta(self.db, "vector_rebuild", None)

    async def embed_pending(self, pipeline: EmbeddingPipeline, report: SyncReport,
                            progress: Callable[[int], None] | None = None) -> None:
        """Embed every pending chunk, batch by batch; raises EmbedderError, leaving the rest pending."""
        if not self.vectors.available:
            return
        identity = EmbedderIdentity.of(pipeline.embedder)
        while True:
            rows = await asyncio.to_thread(self._pending_rows, EMBED_ROWS_PER_BATCH)
            if not rows:
                await asyncio.to_thread(self._rebuild_done)
                return
            sent = [pipeline.text_to_send(r[1]) for r in rows]
            hashes = [sha256_text(t) for t in sent]
            vectors = await asyncio.to_thread(self._cached, identity, hashes)
            report.cache_hits += sum(1 for h in hashes if h in vectors)
            misses: dict[str, str] = {}
            for h, text in zip(hashes, sent):
                if h not in vectors:
                    misses.setdefault(h, text)
            miss_hashes = list(misses)
            done = 0
            for batch in pipeline.batches([misses[h] for h in miss_hashes]):
                report.embedder_calls += 1
                result = await pipeline.embed_batch(batch)
                for h, vec in zip(miss_hashes[done:done + len(batch)], result):
                    vectors[h] = (len(vec), quantize_int8(vec))
                done += len(batch)
            report.embedded += await asyncio.to_thread(self._store, identity, rows, hashes, vectors, set(miss_hashes))
            if progress is not None:
                progress(report.embedded)

    # --- sync --------------------------------------------------------------------------

    async def sync(self, pipeline: EmbeddingPipeline | None, *, paths: list[Path] | None = None,
                   progress: ProgressCallback | None = None) -> SyncReport:
        """One sync: given files (or all, forgetting vanished ones), then pending vectors."""
        started = time.perf_counter()
        report = SyncReport()
        identity = EmbedderIdentity.of(pipeline.embedder) if pipeline else None
        await asyncio.to_thread(self.prepare_vectors, identity)
        if paths is None:
            files = await asyncio.to_thread(self.list_transcripts)
            present = await asyncio.to_thread(lambda: {self.rel_path(p) for p in files})
            report.merge(await asyncio.to_thread(self.forget_missing, present))
        else:
            files = paths
        for done, path in enumerate(files, 1):
            report.merge(await asyncio.to_thread(self.sync_file, path))
            if progress is not None:
                progress(SyncProgress("files", done, len(files), report.chunks_written, report.embedded, 0))
        if pipeline is not None:
            pending_total = await asyncio.to_thread(self.pending_count)

            def embedded(n: int) -> None:
                if progress is not None:
                    progress(SyncProgress("embedding", len(files), len(files), report.chunks_written,
                                          n, max(0, pending_total - n)))
            try:
                await self.embed_pending(pipeline, report, embedded)
            except EmbedderError as exc:
                report.error = f"embedder: {exc}"
                log.warning("memory.embed.failed", error=str(exc), retryable=exc.retryable,
                            effect="chunks stay pending (keyword-searchable); retried next sync")
        report.pending = await asyncio.to_thread(self.pending_count)
        report.duration_ms = (time.perf_counter() - started) * 1000
        return report
