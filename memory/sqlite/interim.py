"""The vector leg during a rebuild: the previous embedder's vectors, read from the embedding cache.

After an embedder change (``memory.sqlite.index.vectors``) ``chunks_vec`` is dropped and refilled
with the new model's vectors, chunk by chunk; searching those while they are half built would
miss most chunks. The previous model's int8 vectors are all still in ``embedding_cache``
(nothing prunes it), keyed by ``coalesce(chunks.vector_hash, chunks.content_hash)``, so until
the rebuild ends the vector leg runs over them instead, with the query embedded by the previous
model (the service builds that embedder; ``memory.embedders.embeddings.previous_embedder``).

**What is held** (one :class:`PreviousVectors` per database file and previous identity, one
partition per user, loaded on the user's first search of the rebuild): each chunk's id, the
sign bits of its previous vector and its time span, as :mod:`memory.sqlite.index.knn` holds them for
``chunks_vec`` (73 bytes a chunk at 384 dims), scanned by the same Hamming pre-filter. The
pool is then re-scored in SQL by exact cosine against the cached int8 vectors
(:data:`RESCORE_SQL`), with every filter applied again on ``chunks``: a chunk deleted since
the load drops out there, and a reused chunk id is scored by its current text's vector.

**Never two models in one ranking**: only previous-model vectors are scored. A chunk whose
text the previous model never embedded (one written during the rebuild) is not in the leg
at all; the keyword leg still finds it. Each search first reads the chunks written since the
partition last looked (ids above the table's highest id then, a range of the rowid) and adds the
user's that the previous model embedded, so a full reindex or a re-cut to a text that model
knew keeps the chunk in the leg; once what was added since the load passes a quarter of it
(a full reindex), the partition is loaded again, which drops the deleted chunks' slots (until
then they drop out in the re-score's join). A chunk id reused by a re-cut keeps its old sign
bits in the pre-filter (the re-score is its current text's). :func:`release` drops the
partitions when the rebuild ends or the service closes.

Every method blocks; call it from the search's worker thread.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import apsw

from memory.embedders.previous import EmbedderIdentity
from memory.sqlite.index import knn

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["RESCORE_SQL", "PreviousVectors", "Released", "cached_dims", "held", "identity_params",
           "release", "session_ids", "vectors_for"]

# As memory.sqlite.index.vectors stores them in chunks_vec: a chunk without timestamps fails every
# time filter, as NULL does in SQL.
_NEVER = 2**62

# The previous model's vector of a chunk: under the key the chunk was embedded with then, or
# under its content hash when the new model has re-keyed it since (its text is sent redacted
# to one of the two and not the other). coalesce() evaluates the second lookup only when the
# first finds nothing.
_VECTOR_OF_CHUNK = """coalesce(
    (SELECT vector FROM embedding_cache WHERE provider = :provider AND model = :model
        AND endpoint_hash = :endpoint_hash
        AND content_hash = coalesce(chunks.vector_hash, chunks.content_hash)),
    (SELECT vector FROM embedding_cache WHERE provider = :provider AND model = :model
        AND endpoint_hash = :endpoint_hash AND content_hash = chunks.content_hash))"""

# Chunks without a previous vector come back with NULL and are skipped by the reader: a
# ``WHERE vector IS NOT NULL`` here would evaluate the lookups twice per row (the planner
# flattens a subquery into its outer query, expressions and all).
_LOAD_SQL = f"""
SELECT chunks.id, chunks.start_ms, chunks.end_ms, {_VECTOR_OF_CHUNK}
FROM chunks WHERE chunks.user = :user AND chunks.id <= :high
"""

# The user's chunks written since the partition last looked: a range of the rowid, the rows
# every user wrote since (``+`` keeps the planner off the user's index, which would walk every
# chunk of the user at each search).
_NEWER_SQL = f"""
SELECT chunks.id, chunks.start_ms, chunks.end_ms, {_VECTOR_OF_CHUNK}
FROM chunks WHERE chunks.id > :after AND chunks.id <= :high AND +chunks.user = :user
"""

_HIGH_SQL = "SELECT coalesce(max(id), 0) FROM chunks"

# The pool from the pre-filter, re-scored exactly; ``{filters}`` are the keyword leg's fixed
# fragments on ``chunks`` (memory.sqlite.search). No ``embedded = 1`` here: during a
# rebuild most chunks are pending for the new model, and that is what this leg is for.
RESCORE_SQL = f"""
WITH pooled AS MATERIALIZED (
    SELECT chunks.id, {_VECTOR_OF_CHUNK} AS vector
    FROM json_each(:pool) AS pool
    CROSS JOIN chunks ON chunks.id = pool.value
    WHERE chunks.user = :user{{filters}}
)
SELECT id, 1.0 - vec_distance_cosine(vec_int8(vector), vec_int8(:query_int8)) AS similarity
FROM pooled WHERE vector IS NOT NULL
ORDER BY similarity DESC, id
LIMIT :candidates
"""

# Rows read between two packings of sign bits (and checks for a release).
_LOAD_BATCH = 4096

_SESSION_IDS_SQL = "SELECT id FROM chunks WHERE user = ? AND session_key = ?"


def identity_params(identity: EmbedderIdentity) -> dict[str, str]:
    return {"provider": identity.provider, "model": identity.model,
            "endpoint_hash": identity.endpoint_hash}


def cached_dims(db: apsw.Connection, identity: EmbedderIdentity) -> int | None:
    """The width of ``identity``'s cached vectors (None when it has none): a query embedded
    by a rebuilt previous embedder must have it."""
    row = db.execute("SELECT dims FROM embedding_cache WHERE provider = :provider "
                     "AND model = :model AND endpoint_hash = :endpoint_hash LIMIT 1",
                     identity_params(identity)).fetchone()
    return int(row[0]) if row is not None else None


@dataclass(slots=True)
class _Part:
    partition: Any  # knn._Partition
    chunks: int
    top: int        # the table's highest chunk id when the partition last looked
    loaded: int     # chunks at the load
    added: int = 0  # chunks added since


class Released(Exception):
    """The rebuild ended (or the service closed) while a load was running: it stops."""


class PreviousVectors:
    """The previous identity's sign bits for one database, one partition per user."""

    def __init__(self, identity: EmbedderIdentity) -> None:
        self.identity = identity
        self._lock = threading.Lock()
        self._parts: dict[str, _Part] = {}
        self._released = threading.Event()

    @property
    def chunks(self) -> int:
        """Chunks held, over every loaded user."""
        with self._lock:
            return sum(p.chunks for p in self._parts.values())

    def nearest(self, db: apsw.Connection, user: str, query_int8: bytes, filters: knn.Filters, *,
                scan: int, pool: int, scan_share: float) -> list[int]:
        """Up to ``pool`` of ``user``'s chunk ids nearest ``query_int8`` by the previous
        model's sign bits (:meth:`memory.sqlite.index.knn._Partition.nearest`), filtered."""
        import numpy

        query = numpy.frombuffer(query_int8, dtype=numpy.int8)
        with self._lock:
            part = self._catch_up(db, user, len(query), self._part(db, user, len(query)))
            return list(part.partition.nearest(query, scan, pool, filters, scan_share))

    def warm(self, db: apsw.Connection) -> tuple[int, int]:
        """Load every user's partition (its own read transaction); returns (users, chunks).

        The service runs it in the background as soon as the previous model serves: a load
        costs ~1-2 s per 100k chunks (one cache lookup per chunk), which the first search
        would otherwise pay. A search arriving meanwhile waits on the lock, or loads its own
        user first. :func:`release` stops it between batches.
        """
        with db:
            dims = cached_dims(db, self.identity)
            if dims is None:
                return 0, 0
            users = knn.distinct_users(db)
            chunks = 0
            for user in users:
                with self._lock:
                    chunks += self._part(db, user, dims, stoppable=True).chunks
        return len(users), chunks

    def release(self) -> None:
        self._released.set()

    def _part(self, db: apsw.Connection, user: str, dims: int, *, stoppable: bool = False) -> _Part:
        """``user``'s partition, loaded now if it is not yet (caller holds the lock)."""
        part = self._parts.get(user)
        if part is None:
            part = self._parts[user] = self._load(db, user, dims, stoppable)
        return part

    def _load(self, db: apsw.Connection, user: str, dims: int, stoppable: bool) -> _Part:
        """``user``'s partition; ``stoppable`` (the warm-up, never a search) gives up with
        :class:`Released` once :meth:`release` was called."""
        high = _high(db)
        rows = db.execute(_LOAD_SQL, {"user": user, "high": high,
                                      **identity_params(self.identity)})
        ids, bits, starts, ends = self._read(rows, dims, stoppable)
        return _Part(knn.detached_partition(ids, bits, starts, ends), len(ids), high, len(ids))

    def _catch_up(self, db: apsw.Connection, user: str, dims: int, part: _Part) -> _Part:
        """``part`` with the user's chunks written since it last looked, or loaded again
        (module docstring); the caller holds the lock."""
        high = _high(db)
        if high <= part.top:
            # Nothing written since (the common case: one look-up of the rowid). Lower after
            # the table's last chunks went: the ids above are free again for new chunks.
            part.top = high
            return part
        rows = db.execute(_NEWER_SQL, {"user": user, "after": part.top, "high": high,
                                       **identity_params(self.identity)})
        ids, bits, starts, ends = self._read(rows, dims, False)
        if (part.added + len(ids)) * 4 > part.loaded:
            part = self._parts[user] = self._load(db, user, dims, False)
            return part
        part.partition.append(ids, bits, starts, ends)
        part.chunks += len(ids)
        part.added += len(ids)
        part.top = high
        return part

    def _read(self, rows: Any, dims: int, stoppable: bool) -> tuple[Any, Any, Any, Any]:
        """Ids, sign bits and time spans of the rows that have a previous vector of ``dims``."""
        import numpy

        ids: list[int] = []
        starts: list[int] = []
        ends: list[int] = []
        bits: list[npt.NDArray[Any]] = []
        blobs: list[bytes] = []

        def pack() -> None:
            # Sign bits batch by batch: the int8 vectors are never all in memory at once.
            vectors = numpy.frombuffer(b"".join(blobs), numpy.int8).reshape(len(blobs), dims)
            bits.append(numpy.packbits(vectors > 0, axis=1, bitorder="little"))
            blobs.clear()

        for cid, start, end, blob in rows:
            if blob is None or len(blob) != dims:
                continue  # no previous vector, or another width: never scored
            ids.append(int(cid))
            starts.append(_NEVER if start is None else int(start))
            ends.append(-1 if end is None else int(end))
            blobs.append(bytes(blob))
            if len(blobs) >= _LOAD_BATCH:
                if stoppable and self._released.is_set():
                    raise Released
                pack()
        pack()
        return (numpy.array(ids, numpy.int64), numpy.concatenate(bits),
                numpy.array(starts, numpy.int64), numpy.array(ends, numpy.int64))


def _high(db: apsw.Connection) -> int:
    """The table's highest chunk id (every user's)."""
    row = db.execute(_HIGH_SQL).fetchone()
    return int(row[0]) if row is not None else 0


def session_ids(db: apsw.Connection, user: str, session_key: str | None) -> list[int] | None:
    """A session filter as the partition applies it (pending chunks included)."""
    if session_key is None:
        return None
    return [int(cid) for (cid,) in db.execute(_SESSION_IDS_SQL, (user, session_key))]


_registry: dict[str, PreviousVectors] = {}
_registry_lock = threading.Lock()


def _key(path: str | os.PathLike[str]) -> str:
    return os.path.realpath(os.fspath(path))


def vectors_for(path: str | os.PathLike[str], identity: EmbedderIdentity) -> PreviousVectors:
    """The process's :class:`PreviousVectors` of ``identity`` for the database at ``path``."""
    key = _key(path)
    with _registry_lock:
        held = _registry.get(key)
        if held is None or held.identity != identity:
            held = _registry[key] = PreviousVectors(identity)
        return held


def held(path: str | os.PathLike[str]) -> PreviousVectors | None:
    """What is held for ``path`` now, if anything (status and tests)."""
    with _registry_lock:
        return _registry.get(_key(path))


def release(path: str | os.PathLike[str]) -> None:
    """Drop what is held for ``path`` (its rebuild ended, or its service closed); a load
    running there stops at its next batch."""
    with _registry_lock:
        held = _registry.pop(_key(path), None)
    if held is not None:
        held.release()
