"""Vectors: the ``chunks_vec`` table, the embedding cache, and the rebuild state.

Chunks start *pending* (``embedded = 0``). Embedding them (:mod:`memory.sqlite.index.indexing`
drives it) takes cached vectors first — the cache holds int8, ``chunks_vec`` the sign bits,
``chunks.vector_hash`` the cache key for the search's exact re-rank — and the embedder only for
texts never seen under this embedder identity; each batch is committed, so an interrupted index
resumes where it stopped.

Embedder change: the identity (provider, model, endpoint hash) is kept in ``meta``. When it
differs, one transaction drops ``chunks_vec``, marks every chunk pending, sets
``meta.vector_rebuild`` and records the identity whose vectors were complete as
``meta.embedder_previous``. Until the pending count reaches zero the new model's vector leg
reports itself unavailable; meanwhile the previous model's vectors, still in the embedding
cache (nothing prunes it), serve the vector leg when the service can embed the query with
that model (:mod:`memory.sqlite.interim`), else hybrid search falls back to keyword and
says why. Either way no ranking ever mixes two models' vectors. The rebuild's end clears both
keys in the transaction that stores its last vector. Rebuilding reuses the cache, so
switching back costs no embedder calls.

Rows changed while sqlite-vec was not loaded set ``meta.vectors_stale``; the next start with
sqlite-vec rebuilds ``chunks_vec`` the same way.

Every vector stored or removed also appends its chunk id to ``vector_changes`` in the same
transaction, and ``meta.vector_generation`` is new whenever ``chunks_vec`` is created or
dropped: that is how the in-memory sign-bit index of the search (``memory.sqlite.index.knn``) brings
itself up to any read snapshot without rescanning. The log keeps its newest :data:`CHANGES_KEPT`
entries; ``meta.vector_changes_floor`` is the highest one trimmed.

Every method of :class:`VectorStore` blocks; call it from a worker thread.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from typing import Any

import apsw
import structlog

from memory.embedders.previous import (
    NOT_BUILT,
    NOT_REBUILDING,
    EmbedderIdentity,
    RebuildState,
    complete_identity,
    rebuild_state,
    rebuilding_reason,
)
from memory.errors import EmbedderError
from memory.quantize import cached_vector_to_int8
from memory.sqlite.index.db import VectorBackend, WriteConnection, get_meta, set_meta
from memory.sqlite.index.knn import CHANGES_TABLE

__all__ = [
    "NOT_REBUILDING",
    "EmbedderIdentity",  # memory.embedders.previous's, used here
    "RebuildState",
    "VectorStore",
    "drop_vector_table",
    "ensure_vector_table",
    "vector_format",
    "vector_table_dims",
]

log = structlog.get_logger("memory.indexer")  # the name these events always had

# Stored for a chunk without timestamps, so that it fails every time filter as NULL does in SQL.
_NEVER = 2**62

# Entries of vector_changes kept: a reader's in-memory index further behind than this reloads
# (~10 ms per 100k chunks) instead of replaying the log. ~20 bytes each on disk.
CHANGES_KEPT = 50_000


def vector_table_dims(db: apsw.Connection) -> int | None:
    """The width of ``chunks_vec`` as recorded in meta, or None when it does not exist."""
    exists = db.execute("SELECT 1 FROM sqlite_schema WHERE name = 'chunks_vec'").fetchone()
    if exists is None:
        return None
    dims = get_meta(db, "vector_dims")
    return int(dims) if dims else None


def vector_format(dims: int) -> str:
    """How ``chunks_vec`` stores a ``dims``-wide vector: sign bits when the width allows
    (``bit[D]`` needs a multiple of 8), else int8. Either way the vector leg re-ranks the
    KNN's candidates by cosine over the cached int8 vectors (``memory.search``)."""
    return "bit" if dims % 8 == 0 else "int8"


def ensure_vector_table(db: apsw.Connection, dims: int) -> None:
    """Create ``chunks_vec`` for ``dims``-wide vectors unless it exists (caller's transaction).

    ``user`` is a partition key so a KNN scans only the caller's vectors; session and time
    are metadata columns so the filters apply inside the KNN, before ``k`` is cut. The
    embedding is quantized (``vector_format``): at 384 dims a row costs 48 bytes of bits
    instead of 1,536 of float32, and a KNN over 100k rows is ~10× faster; the precise
    vector lives once, in ``embedding_cache``.
    """
    fmt = vector_format(int(dims))
    if vector_table_dims(db) == dims and get_meta(db, "vector_format") == fmt:
        return
    db.execute("DROP TABLE IF EXISTS chunks_vec")
    column = f"bit[{int(dims)}]" if fmt == "bit" else f"int8[{int(dims)}] distance_metric=cosine"
    db.execute(
        f"""
        CREATE VIRTUAL TABLE chunks_vec USING vec0(
            chunk_id     INTEGER PRIMARY KEY,
            user         TEXT PARTITION KEY,
            embedding    {column},
            session_key  TEXT,
            start_ms     INTEGER,
            end_ms       INTEGER
        )
        """
    )
    set_meta(db, "vector_dims", str(int(dims)))
    set_meta(db, "vector_format", fmt)
    _new_generation(db)


def drop_vector_table(db: apsw.Connection) -> None:
    db.execute("DROP TABLE IF EXISTS chunks_vec")
    set_meta(db, "vector_dims", None)
    set_meta(db, "vector_format", None)
    _new_generation(db)


def _new_generation(db: apsw.Connection) -> None:
    """Start the change log afresh (caller's transaction): readers' in-memory copies reload."""
    db.execute(f"CREATE TABLE IF NOT EXISTS {CHANGES_TABLE}("
               "seq INTEGER PRIMARY KEY AUTOINCREMENT, chunk_id INTEGER NOT NULL)")
    db.execute(f"DELETE FROM {CHANGES_TABLE}")
    set_meta(db, "vector_changes_floor", None)
    set_meta(db, "vector_generation", secrets.token_hex(8))


def _log_changes(db: apsw.Connection, ids: Iterable[int]) -> None:
    """Record changed vectors for readers' in-memory indexes; trim the log (caller's
    transaction)."""
    db.executemany(f"INSERT INTO {CHANGES_TABLE}(chunk_id) VALUES (?)", [(cid,) for cid in ids])
    (head,) = db.execute(f"SELECT coalesce(max(seq), 0) FROM {CHANGES_TABLE}").fetchone() or (0,)
    floor = int(head) - CHANGES_KEPT
    if floor > int(get_meta(db, "vector_changes_floor") or 0):
        db.execute(f"DELETE FROM {CHANGES_TABLE} WHERE seq <= ?", (floor,))
        set_meta(db, "vector_changes_floor", str(floor))


PendingRow = tuple[Any, ...]  # (id, content, user, session_key, start_ms, end_ms, content_hash)


class VectorStore:
    """The vector side of the index on the writing connection (see the module docstring)."""

    def __init__(self, conn: WriteConnection, backend: VectorBackend) -> None:
        self._conn = conn
        self.db = conn.db
        self.backend = backend

    def prepare(self, identity: EmbedderIdentity | None) -> None:
        """Align stored vectors with the current embedder identity (see the module docstring)."""
        if not self.backend.available:
            return
        with self._conn.lock, self.db:
            # Read before a stale rebuild below clears it: an identity change in the same
            # start still knows which vectors were complete.
            previous = self._complete_identity()
            if get_meta(self.db, "vectors_stale") == "1":
                self._start_rebuild()
                set_meta(self.db, "vectors_stale", None)
            if get_meta(self.db, "vector_generation") is None:
                _new_generation(self.db)  # a database written before the change log existed
            if identity is None:
                return
            stored = get_meta(self.db, "embedder")
            if stored != identity.to_json():
                if previous == identity:
                    previous = None  # switching back mid-rebuild: the cache rebuilds it at once
                if stored is not None:
                    log.warning("memory.embedder.changed", old=stored, new=identity.to_json(),
                                previous=previous.to_json() if previous else None,
                                effect="vectors rebuilt from cache/embedder; until done the vector "
                                       "leg is served by the previous model's vectors when it can "
                                       "embed the query, else hybrid is keyword-only")
                self._start_rebuild()
                set_meta(self.db, "embedder", identity.to_json())
                set_meta(self.db, "embedder_previous", previous.to_json() if previous else None)

    def _complete_identity(self) -> EmbedderIdentity | None:
        """memory.embedders.previous.complete_identity over this file's meta (caller's
        transaction)."""
        return complete_identity(get_meta(self.db, "embedder"),
                                 get_meta(self.db, "vector_rebuild") is not None,
                                 get_meta(self.db, "embedder_previous"))

    def _start_rebuild(self) -> None:
        """Drop every vector and mark every chunk pending (caller's transaction)."""
        drop_vector_table(self.db)
        self.db.execute("UPDATE chunks SET embedded = 0 WHERE embedded = 1")
        set_meta(self.db, "vector_rebuild", "1")
        set_meta(self.db, "embedder_previous", None)  # prepare() records it for an identity change

    def state(self, identity: EmbedderIdentity | None) -> tuple[bool, str]:
        """Whether the vector leg may run for ``identity`` now, and if not, why."""
        if not self.backend.available:
            return False, self.backend.reason
        if identity is None:
            return False, "no embedder"
        with self._conn.lock:
            if get_meta(self.db, "embedder") != identity.to_json():
                return False, NOT_BUILT
            if get_meta(self.db, "vector_rebuild") is not None:
                return False, rebuilding_reason(self.pending_count())
            if vector_table_dims(self.db) is None:
                return False, "no vectors indexed yet"
        return True, ""

    def rebuild_state(self, identity: EmbedderIdentity | None) -> RebuildState:
        """Whether ``identity``'s vectors are still to be (re)built after an identity change, and
        the identity whose complete vectors may serve meanwhile."""
        if not self.backend.available:
            return NOT_REBUILDING
        with self._conn.lock:
            return rebuild_state(identity, get_meta(self.db, "embedder"),
                                 get_meta(self.db, "vector_rebuild") is not None,
                                 get_meta(self.db, "embedder_previous"))

    def forget(self, ids: Iterable[int]) -> None:
        """Remove the vectors of chunks about to be deleted (caller holds the lock and a
        transaction)."""
        if not self.backend.available:
            # Cannot touch chunks_vec without the module: rebuild vectors once it loads again.
            set_meta(self.db, "vectors_stale", "1")
            return
        if vector_table_dims(self.db) is None:
            return
        ids = list(ids)
        for cid in ids:
            self.db.execute("DELETE FROM chunks_vec WHERE chunk_id = ?", (cid,))
        _log_changes(self.db, ids)

    def pending_count(self) -> int:
        with self._conn.lock:
            (n,) = self.db.execute("SELECT count(*) FROM chunks "
                                   "WHERE embedded = 0").fetchone() or (0,)
        return int(n)

    def pending_rows(self, limit: int) -> list[PendingRow]:
        with self._conn.lock:
            return list(self.db.execute(
                "SELECT id, content, user, session_key, start_ms, end_ms, content_hash FROM chunks "
                "WHERE embedded = 0 ORDER BY id LIMIT ?",
                (limit,),
            ))

    def cached(self, identity: EmbedderIdentity, hashes: list[str]) -> dict[str, tuple[int, bytes]]:
        """``content hash -> (dims, int8 vector)`` for the hashes the cache holds for
        ``identity``."""
        found: dict[str, tuple[int, bytes]] = {}
        with self._conn.lock:
            for h in set(hashes):
                row = self.db.execute(
                    "SELECT dims, vector FROM embedding_cache WHERE provider = ? AND model = ? "
                    "AND endpoint_hash = ? AND content_hash = ?",
                    (identity.provider, identity.model, identity.endpoint_hash, h),
                ).fetchone()
                if row is not None:
                    found[h] = (int(row[0]), cached_vector_to_int8(bytes(row[1]), int(row[0])))
        return found

    def store(self, identity: EmbedderIdentity, rows: list[PendingRow], hashes: list[str],
              vectors: dict[str, tuple[int, bytes]], fresh: set[str]) -> int:
        """Cache the ``fresh`` vectors and store one per row (one transaction); returns the rows
        stored."""
        with self._conn.lock, self.db:
            self._conn.check_room("storing vectors")
            for h in fresh:
                dims, blob = vectors[h]
                self.db.execute(
                    "INSERT OR IGNORE INTO embedding_cache(provider, model, endpoint_hash, "
                    "content_hash, dims, vector) VALUES (?, ?, ?, ?, ?, ?)",
                    (identity.provider, identity.model, identity.endpoint_hash, h, dims, blob),
                )
            dims_seen = {vectors[h][0] for h in hashes}
            if len(dims_seen) != 1:
                raise EmbedderError(f"embedder returned mixed widths {sorted(dims_seen)}",
                                    retryable=False)
            dims = dims_seen.pop()
            ensure_vector_table(self.db, dims)
            quantize_sql = ("vec_quantize_binary(vec_int8(?))" if vector_format(dims) == "bit"
                            else "vec_int8(?)")
            stored: list[int] = []
            for (cid, _content, user, session_key, start_ms, end_ms, chash), h in zip(rows, hashes):
                if self.db.execute("SELECT 1 FROM chunks WHERE id = ? "
                                   "AND embedded = 0", (cid,)).fetchone() is None:
                    continue  # deleted or replaced while its vector was being made
                stored.append(cid)
                self.db.execute("DELETE FROM chunks_vec WHERE chunk_id = ?", (cid,))
                self.db.execute(
                    "INSERT INTO chunks_vec(chunk_id, user, embedding, session_key, start_ms, "
                    f"end_ms) VALUES (?, ?, {quantize_sql}, ?, ?, ?)",
                    (cid, user, vectors[h][1], session_key,
                     _NEVER if start_ms is None else start_ms, -1 if end_ms is None else end_ms),
                )
                # vector_hash is stored only when the text sent differs from the chunk (redaction).
                self.db.execute("UPDATE chunks SET embedded = 1, vector_hash = ? WHERE id = ?",
                                (None if h == chash else h, cid))
            _log_changes(self.db, stored)
            if self.db.execute("SELECT 1 FROM chunks "
                               "WHERE embedded = 0 LIMIT 1").fetchone() is None:
                set_meta(self.db, "vector_rebuild", None)
                set_meta(self.db, "embedder_previous", None)
        return len(stored)

    def rebuild_done(self) -> None:
        """Clear ``meta.vector_rebuild`` once nothing is pending."""
        with self._conn.lock, self.db:
            if get_meta(self.db, "vector_rebuild") is not None and self.pending_count() == 0:
                set_meta(self.db, "vector_rebuild", None)
                set_meta(self.db, "embedder_previous", None)
