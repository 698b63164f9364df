"""Transcripts → chunk rows (+ their FTS rows): the file half of a sync.

Incremental algorithm (per file; :meth:`FileSync.sync_file` commits one file,
:meth:`FileSync.sync_files` a batch of files at once):

1. ``stat``; (size, mtime) unchanged and chunk settings unchanged → nothing to do.
2. The indexed prefix is fingerprinted by sha256 of its first and last 4 KiB plus its length.
   If the file is shorter than the indexed offset, or the fingerprint differs, the file was
   rewritten or truncated → its rows are deleted and it is indexed whole.
3. Otherwise only the tail is read: from the byte offset of the *last* chunk's first line
   (chunks before it are closed — see ``memory.chunking``), re-packed, and compared by index
   with the stored chunks: identical chunks stay, changed/new ones are written. Cost is the
   last chunk plus the new text.
4. A file that disappeared loses its rows.

Nothing in the layout is taken on trust: a symlink (or anything but a regular file) is never
followed, and a transcript whose header names another user or session than its path is not
indexed. Either is *skipped*: its rows (if any) are removed, it is logged once as
``memory.file_skipped`` with the reason, and :attr:`FileSync.skipped` keeps it until the file
is fixed or gone. Otherwise a copy of alice's transcript in ``bob/``, or a link to any file
the daemon can read, would become bob's to search.

Transcripts are read with the sessions package's own :class:`~sessions.ForwardReader` (their
header with :func:`~sessions.read_header`) and found through its path layout, so the index
sees exactly the messages and the files the store writes. New and changed chunks are left
pending for :mod:`memory.sqlite.index.vectors`.

Every method of :class:`FileSync` blocks; call it from a worker thread.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import structlog

from memory.chunking import Chunk, chunk_messages, fts_text, iso_to_ms, visible_entries
from memory.config import MemoryConfig, SizedConfig
from memory.reports import SyncReport
from memory.sqlite.forgetting import (
    ForgetRange,
    chunk_ids_for_file,
    matching_chunk_ids,
    old_chunk_ids,
    record_forgotten,
    retention_cutoff_ms,
)
from memory.sqlite.index.db import WriteConnection
from memory.sqlite.index.vectors import VectorStore
from sessions import (
    ForwardReader,
    Header,
    parse_transcript_relpath,
    read_header,
    scan_transcripts,
    transcript_file,
    transcript_relpath,
)

__all__ = ["FileSync", "SyncReport", "chunking_fingerprint"]

log = structlog.get_logger("memory.sync")

_FINGERPRINT_BYTES = 4096
# A header line longer than this is not one the store wrote (a system prompt is at most 64Ki
# characters, so its JSON is well below): line 1 is looked for in this many bytes only.
_MAX_HEADER_BYTES = 1 << 20

_Owner = tuple[str, str]  # (user, session_key)
# A file's writes inside FileSync.sync_files: the batch's transaction covers them.
_IN_BATCH: AbstractContextManager[object] = nullcontext()


def chunking_fingerprint(sizes: SizedConfig) -> str:
    return f"v1:{sizes.chunk_tokens}:{sizes.overlap_tokens}"


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _own_header(path: Path, st: os.stat_result, owner: _Owner) -> Header | str | None:
    """``path``'s header, read once through the sessions package's reader: a string when the
    file must not be indexed as ``owner``'s (why), the :class:`~sessions.Header` when it may
    (its ``memory`` flag says whether to index it), None when there is no whole header to
    check yet (still being written, or gone) and it may be indexed as far as it is whole.

    ``st`` is the path's lstat."""
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    try:
        # O_NOFOLLOW: a symlink swapped in since the lstat is refused, not followed.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None  # gone: the caller's next look deletes its rows
    except OSError as exc:
        return f"cannot open: {exc.strerror}"
    try:
        limit = min(os.fstat(fd).st_size, _MAX_HEADER_BYTES)
        found = read_header(fd, limit)
        # Only when line 1 is not a header: a line still being written is checked once whole.
        if found is None and b"\n" not in os.pread(fd, limit, 0):
            return None
    finally:
        os.close(fd)
    if found is None:
        return "the first line is not a transcript header"
    header = found[0]
    if (header.user, header.session_key) != owner:
        return "its header names another user or session than its path"
    return header


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


class FileSync:
    """Keeps the ``files``, ``chunks`` and ``chunks_fts`` rows in step with the transcripts."""

    def __init__(self, conn: WriteConnection, sessions_dir: Path, config: MemoryConfig,
                 vectors: VectorStore, *, window: int | None = None) -> None:
        self._conn = conn
        self.db = conn.db
        self.sessions_dir = sessions_dir
        self._resolved_root = sessions_dir.resolve()
        self.config = config
        self.vectors = vectors
        self.sizes = config.sized_for(window)   # chunks fit the embedder's window
        self.chunking = chunking_fingerprint(self.sizes)
        # Relative path -> why it is not indexed (the module docstring, "skipped").
        self.skipped: dict[str, str] = {}

    # --- which files -------------------------------------------------------------------

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
        """Every transcript on disk, in path order (which is the order chunk ids follow)."""
        return [transcript_file(self.sessions_dir, user, key)
                for user, key in sorted(scan_transcripts(self.sessions_dir))]

    def _file_row(self, rel: str) -> _FileRow | None:
        row = self.db.execute(
            "SELECT size, mtime_ns, hash, indexed_offset, indexed_lines, chunking FROM files "
            "WHERE path = ?",
            (rel,),
        ).fetchone()
        return None if row is None else _FileRow(*row)

    # --- one file ----------------------------------------------------------------------

    def sync_file(self, path: Path) -> SyncReport:
        """Bring one transcript's rows in step with the file (see the module docstring), in
        its own transaction."""
        with self._conn.lock:
            return self._sync_file(path, self.db)

    def _sync_file(self, path: Path, atomic: AbstractContextManager[object]) -> SyncReport:
        """:meth:`sync_file`, each write inside ``atomic``: the connection (a transaction, or a
        savepoint within one), or nothing when the caller's transaction covers it whole."""
        report = SyncReport(files_scanned=1)
        rel = self.rel_path(path)
        owner = parse_transcript_relpath(rel)
        if owner is None:
            return report
        with self._conn.lock:
            try:
                st = path.lstat()  # never follows a symlink
            except FileNotFoundError:
                self.skipped.pop(rel, None)
                with atomic:
                    report.chunks_deleted = self._delete_path(rel)
                    deleted = self.db.changes()
                report.files_deleted = 1 if deleted or report.chunks_deleted else 0
                return report
            row = self._file_row(rel)
            if (row and stat.S_ISREG(st.st_mode) and row.chunking == self.chunking
                    and (row.size, row.mtime_ns) == (st.st_size, st.st_mtime_ns)):
                return report
            incremental = (
                row is not None
                and row.indexed_offset > 0  # else the header was never read whole, nor checked
                and stat.S_ISREG(st.st_mode)
                and row.chunking == self.chunking
                and st.st_size >= row.indexed_offset
                and _prefix_fingerprint(path, row.indexed_offset) == row.hash
            )
            # Checked on every change, incremental or not: the same read gives the memory flag.
            header = _own_header(path, st, owner)
            if isinstance(header, str):
                self._skip(rel, header, report, atomic)
                return report
            self.skipped.pop(rel, None)
            if header is not None and not header.memory:
                # Incognito: the transcript is kept but never indexed; rows from before are dropped.
                with atomic:
                    report.chunks_deleted = self._delete_path(rel)
                return report
            # Below the free-disk floor the sync stops here, rolled back whole; a later one redoes
            # it.
            self._conn.check_room("indexing a transcript")
            with atomic:
                if incremental:
                    assert row is not None
                    written, deleted, end_offset, end_line = self._index_tail(path, rel, owner, row)
                else:
                    deleted = self._delete_path(rel)
                    written, _, end_offset, end_line = self._index_from(
                        path, rel, owner, 0, 1, 0, 0)
                self.db.execute(
                    """
                    INSERT INTO files(path, user, session_key, size, mtime_ns, hash, indexed_offset,
                                      indexed_lines, chunking, indexed_at)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                    ON CONFLICT(path) DO UPDATE SET
                        size = excluded.size, mtime_ns = excluded.mtime_ns, hash = excluded.hash,
                        indexed_offset = excluded.indexed_offset,
                        indexed_lines = excluded.indexed_lines,
                        chunking = excluded.chunking, indexed_at = excluded.indexed_at
                    """,
                    (rel, owner[0], owner[1], st.st_size, st.st_mtime_ns,
                     _prefix_fingerprint(path, end_offset), end_offset, end_line,
                     self.chunking, _now()),
                )
                # Expired or forgotten text goes in the same transaction it was written in.
                deleted += self._delete_ids(chunk_ids_for_file(
                    self.db, rel, owner[0], owner[1],
                    retention_cutoff_ms(self.config.retention_days)))
        report.files_changed = 1 if (written or deleted or row is None or not incremental) else 0
        report.chunks_written, report.chunks_deleted = written, deleted
        return report

    def sync_files(self, paths: list[Path], start: int, *, max_files: int,
                   max_s: float) -> tuple[SyncReport, int]:
        """:meth:`sync_file` for ``paths[start:]`` in one transaction, until ``max_files`` are
        done or ``max_s`` has passed; returns the merged report and the index to go on from.

        One commit covers the batch, and the files in it take no savepoint of their own: FTS5
        writes its pending terms as a new segment at every commit *and* every savepoint, so a
        commit per file was a quarter of a keyword-only build, a savepoint per file then half
        of what was left, and one worker-thread hop per file another tenth (bench/README.md,
        "Scale"). A file's own savepoint would buy nothing: an error in any file rolls the
        whole batch back (the next sync redoes it). ``max_s`` bounds how long other writers
        wait on the lock.
        """
        report = SyncReport()
        deadline = time.perf_counter() + max_s
        end = min(len(paths), start + max(1, max_files))
        i = start
        with self._conn.lock, self.db:
            while i < end:
                report.merge(self._sync_file(paths[i], _IN_BATCH))
                i += 1
                if time.perf_counter() >= deadline:
                    break
        return report, i

    def _skip(self, rel: str, reason: str, report: SyncReport,
              atomic: AbstractContextManager[object]) -> None:
        if self.skipped.get(rel) != reason:  # logged once per file and reason, not every sync
            log.warning("memory.file_skipped", path=rel, reason=reason,
                        effect="not indexed; its text is not searchable")
        self.skipped[rel] = reason
        report.files_skipped = 1
        with atomic:
            report.chunks_deleted = self._delete_path(rel)

    def _index_tail(self, path: Path, rel: str, owner: _Owner,
                    row: _FileRow) -> tuple[int, int, int, int]:
        last = self.db.execute(
            "SELECT chunk_idx, byte_start, line_start, seg_start FROM chunks WHERE path = ? "
            "ORDER BY chunk_idx DESC LIMIT 1",
            (rel,),
        ).fetchone()
        if last is None:
            return self._index_from(path, rel, owner, row.indexed_offset, row.indexed_lines + 1, 0,
                                    0, known_end=row.indexed_offset)
        idx, byte_start, line_start, seg_start = last
        return self._index_from(path, rel, owner, byte_start, line_start, idx, seg_start,
                                known_end=row.indexed_offset)

    def _index_from(self, path: Path, rel: str, owner: _Owner, offset: int, line: int,
                    first_idx: int, skip_segments: int,
                    known_end: int | None = None) -> tuple[int, int, int, int]:
        reader = ForwardReader(path, offset, line)
        entries, whole = visible_entries(list(reader),
                                         new_from=offset if known_end is None else known_end)
        if whole and offset > 0:
            # A new edit or regenerate: the chunks before this read may hold what it hides, so
            # the transcript is re-cut from its start (unchanged chunks stay, by index and hash).
            return self._index_from(path, rel, owner, 0, 1, 0, 0)
        chunks = chunk_messages(entries, self.sizes.chunk_tokens, self.sizes.overlap_tokens,
                                first_idx=first_idx, skip_segments=skip_segments)
        if known_end is not None and reader.end_offset == known_end:
            # Nothing complete was appended (maybe a partial line): the stored chunks stand.
            return 0, 0, reader.end_offset, reader.end_line
        written, deleted = self._replace_chunks(rel, owner, first_idx, chunks)
        return written, deleted, reader.end_offset, reader.end_line

    def _replace_chunks(self, rel: str, owner: _Owner, first_idx: int,
                        chunks: list[Chunk]) -> tuple[int, int]:
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
            if old is not None and old[1:] == (chunk.content_hash, chunk.line_start,
                                               chunk.line_end):
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

    def _insert_chunk(self, rel: str, owner: _Owner, chunk: Chunk) -> None:
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
        self.db.execute("INSERT INTO chunks_fts(rowid, body) VALUES (?, ?)",
                        (chunk_id, fts_text(chunk.content)))

    def _delete_ids(self, ids: list[int]) -> int:
        if not ids:
            return 0
        self.vectors.forget(ids)
        for cid in ids:
            self.db.execute("DELETE FROM chunks_fts WHERE rowid = ?", (cid,))
            self.db.execute("DELETE FROM chunks WHERE id = ?", (cid,))
        return len(ids)

    def _delete_path(self, rel: str) -> int:
        ids = [r[0] for r in self.db.execute("SELECT id FROM chunks WHERE path = ?", (rel,))]
        n = self._delete_ids(ids)
        self.db.execute("DELETE FROM files WHERE path = ?", (rel,))
        return n

    # --- many files --------------------------------------------------------------------

    def prune_expired(self, cutoff_ms: int) -> int:
        """Retention: drop every chunk whose newest message is older than ``cutoff_ms``."""
        with self._conn.lock, self.db:
            removed = self._delete_ids(old_chunk_ids(self.db, cutoff_ms))
        return removed

    def forget(self, r: ForgetRange, *, record: bool) -> int:
        """memory.forget: drop the matching chunks, and with ``record`` keep the range so later
        syncs drop them again (the transcript still holds the text)."""
        with self._conn.lock, self.db:
            if record:
                record_forgotten(self.db, r)
            removed = self._delete_ids(matching_chunk_ids(self.db, r))
        return removed

    def delete_session(self, user: str, session_key: str) -> int:
        """Remove every row of one session at once; returns the chunks removed."""
        rel = transcript_relpath(user, session_key)
        if parse_transcript_relpath(rel) != (user, session_key):
            return 0  # not a name the store could have written: there are no rows for it
        with self._conn.lock, self.db:
            removed = self._delete_path(rel)
        return removed

    def forget_missing(self, present: set[str]) -> SyncReport:
        """Delete rows of indexed files whose relative path is not in ``present``."""
        report = SyncReport()
        with self._conn.lock:
            gone = [r[0] for r in self.db.execute("SELECT path FROM files") if r[0] not in present]
            for rel in gone:
                with self.db:
                    report.chunks_deleted += self._delete_path(rel)
                report.files_deleted += 1
        # A scan never lists symlinks, so a skipped path is forgotten only once it is gone.
        for rel in [r for r in self.skipped
                    if r not in present and not os.path.lexists(self.sessions_dir / r)]:
            del self.skipped[rel]
        return report

    def reset_files(self, user: str | None = None) -> None:
        """Forget every file's offset (or only ``user``'s) so the next sync re-reads those
        transcripts (``reindex full``).

        Rows stay until each file is re-indexed (in its own transaction), so search keeps
        working throughout. Each file's chunks are then deleted and written anew (step 2 of
        the module docstring); their vectors come back from the embedding cache.
        """
        with self._conn.lock, self.db:
            if user is None:
                self.db.execute("UPDATE files SET size = -1, hash = '', chunking = 'reset'")
            else:
                self.db.execute("UPDATE files SET size = -1, hash = '', chunking = 'reset' "
                                "WHERE user = ?", (user,))
