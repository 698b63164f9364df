"""The vector leg during a rebuild: the previous embedder's vectors, read from the embedding cache.

After an embedder change (``memory.index.vectors``) ``chunks_vec`` is dropped and refilled
with the new model's vectors, chunk by chunk; searching those while they are half built would
miss most chunks. The previous model's int8 vectors are all still in ``embedding_cache``
(nothing prunes it), keyed by ``coalesce(chunks.vector_hash, chunks.content_hash)``, so until
the rebuild ends the vector leg runs over them instead, with the query embedded by the previous
model (the service builds that embedder; ``memory.embedders.embeddings.previous_embedder``).

**What is held** (one :class:`PreviousVectors` per database file and previous identity, one
partition per user, loaded on the user's first search of the rebuild): each chunk's id, the
sign bits of its previous vector and its time span, as :mod:`memory.index.knn` holds them for
``chunks_vec`` (73 bytes a chunk at 384 dims), scanned by the same Hamming pre-filter. The
pool is then re-scored in SQL by exact cosine against the cached int8 vectors
(:data:`RESCORE_SQL`), with every filter applied again on ``chunks``: a chunk deleted since
the load drops out there, and a reused chunk id is scored by its current text's vector.

**Never two models in one ranking**: only previous-model vectors are scored. A chunk whose
text the previous model never embedded (one written during the rebuild) is not in the leg
at all; the keyword leg still finds it. The partition is not refreshed while the rebuild runs
(it only loses rows, through the re-score's join), and :func:`release` drops it when the
rebuild ends or the service closes.

Every method blocks; call it from the search's worker thread.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import apsw

from memory.index import knn
from memory.index.vectors import EmbedderIdentity

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["RESCORE_SQL", "PreviousVectors", "cached_dims", "held", "identity_params", "release", "session_ids", "vectors_for"]

# As memory.index.vectors stores them in chunks_vec: a chunk without timestamps fails every
# time filter, as NULL does in SQL.
_NEVER = 2**62

# The previous model's vector of a chunk: under the key the chunk was embedded with then, or
# under its content hash when the new model has re-keyed it since (its text is sent redacted
# to one of the two and not the other). coalesce() evaluates the second lookup only when the
# first finds nothing.
_VECTOR_OF_CHUNK = """coalesce(
    (SELECT vector FROM embedding_cache WHERE provider = :provider AND model = :model
        AND endpoint_hash = :endpoint_hash AND content_hash = coalesce(chunks.vector_hash, chunks.content_hash)),
    (SELECT vector FROM embedding_cache WHERE provider = :provider AND model = :model
        AND endpoint_hash = :endpoint_hash AND content_hash = chunks.content_hash))"""

_LOAD_SQL = f"""
SELECT id, start_ms, end_ms, vector FROM (
    SELECT chunks.id, chunks.start_ms, chunks.end_ms, {_VECTOR_OF_CHUNK} AS vector
    FROM chunks WHERE chunks.user = :user
) WHERE vector IS NOT NULL
"""

# The pool from the pre-filter, re-scored exactly; ``{filters}`` are the keyword leg's fixed
# fragments on ``chunks`` (memory.retrieval.search). No ``embedded = 1`` here: during a
# rebuild most chunks are pending for the new model, and that is what this leg is for.
RESCORE_SQL = f"""
SELECT id, 1.0 - vec_distance_cosine(vec_int8(vector), vec_int8(:query_int8)) AS similarity FROM (
    SELECT chunks.id, {_VECTOR_OF_CHUNK} AS vector
    FROM json_each(:pool) AS pool
    CROSS JOIN chunks ON chunks.id = pool.value
    WHERE chunks.user = :user{{filters}}
) WHERE vector IS NOT NULL
ORDER BY similarity DESC, id
LIMIT :candidates
"""

_SESSION_IDS_SQL = "SELECT id FROM chunks WHERE user = ? AND session_key = ?"


def identity_params(identity: EmbedderIdentity) -> dict[str, str]:
    return {"provider": identity.provider, "model": identity.model, "endpoint_hash": identity.endpoint_hash}


def cached_dims(db: apsw.Connection, identity: EmbedderIdentity) -> int | None:
    """The width of ``identity``'s cached vectors (None when it has none): a query embedded
    by a rebuilt previous embedder must have it."""
    row = db.execute("SELECT dims FROM embedding_cache WHERE provider = :provider AND model = :model "
                     "AND endpoint_hash = :endpoint_hash LIMIT 1", identity_params(identity)).fetchone()
    return int(row[0]) if row is not None else None


@dataclass(slots=True)
class _Part:
    partition: Any  # knn._Partition
    chunks: int


class PreviousVectors:
    """The previous identity's sign bits for one database, one partition per user."""

    def __init__(self, identity: EmbedderIdentity) -> None:
        self.identity = identity
        self._lock = threading.Lock()
        self._parts: dict[str, _Part] = {}

    @property
    def chunks(self) -> int:
        """Chunks held, over every loaded user."""
        with self._lock:
            return sum(p.chunks for p in self._parts.values())

    def nearest(self, db: apsw.Connection, user: str, query_int8: bytes, filters: knn.Filters, *,
                scan: int, pool: int, scan_share: float) -> list[int]:
        """Up to ``pool`` of ``user``'s chunk ids nearest ``query_int8`` by the previous
        model's sign bits (:meth:`memory.index.knn._Partition.nearest`), filtered."""
        import numpy

        query = numpy.frombuffer(query_int8, dtype=numpy.int8)
        with self._lock:
            part = self._parts.get(user)
            if part is None:
                part = self._parts[user] = self._load(db, user, len(query))
            return list(part.partition.nearest(query, scan, pool, filters, scan_share))

    def _load(self, db: apsw.Connection, user: str, dims: int) -> _Part:
        import numpy

        ids: list[int] = []
        starts: list[int] = []
        ends: list[int] = []
        blobs: list[bytes] = []
        for cid, start, end, blob in db.execute(_LOAD_SQL, {"user": user, **identity_params(self.identity)}):
            if len(blob) != dims:
                continue  # another width (cannot be compared with this query): never scored
            ids.append(int(cid))
            starts.append(_NEVER if start is None else int(start))
            ends.append(-1 if end is None else int(end))
            blobs.append(bytes(blob))
        vectors: npt.NDArray[Any] = numpy.frombuffer(b"".join(blobs), numpy.int8).reshape(len(ids), dims)
        bits = numpy.packbits(vectors > 0, axis=1, bitorder="little")
        partition = knn.detached_partition(numpy.array(ids, numpy.int64), bits,
                                           numpy.array(starts, numpy.int64), numpy.array(ends, numpy.int64))
        return _Part(partition, len(ids))


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
    """Drop what is held for ``path`` (its rebuild ended, or its service closed)."""
    with _registry_lock:
        _registry.pop(_key(path), None)
