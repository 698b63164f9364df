"""The vectors on PostgreSQL: the leg's index, created once the embedder's width is known; the
indexer's pending and fill statements; an embedder change's rebuild.

``recalld_memory_chunks.embedding`` is a ``halfvec`` of no fixed width (the width is the
embedder's, known at run time, as SQLite's ``chunks_vec`` is created by the writer). An
index needs one, so it is an expression index over ``embedding::halfvec(D)``, made by the
first node that stores a vector and recorded as ``meta.vector_dims``; searches cast to the
same ``D`` so the planner can use it. ``VECTOR_LEG`` picks the leg's shape:

* ``"hnsw"`` (the default): an HNSW graph, ``halfvec_cosine_ops``; the leg is one ordered
  index scan (``hnsw.iterative_scan`` keeps filtered searches full), and the distance it
  orders by is the exact cosine over the int8 values, so no re-rank step is needed.
* ``"bit"``: SQLite's two steps — the nearest ``pool`` by Hamming distance over the sign bits
  (``binary_quantize``; a scan of the user's chunks), then the exact cosine over those.

docs in ``memory/pg/__init__.py`` say which won and by how much.

**Embedder change.** The identity whose vectors fill ``embedding`` is ``meta.embedder``. A node
whose embedder has another identity starts a rebuild in one transaction
(:func:`start_rebuild`): the vectors of the identity that was complete move to
``embedding_previous`` (its width to ``meta.vector_dims_previous``, its identity to
``meta.embedder_previous``), every ``embedding`` empties, the vector index goes and
``meta.vector_rebuild`` is set. A second change before the rebuild ends keeps the complete
identity's vectors where they are (the half-built ones never serve); changing back to it
needs none (the cache holds its vectors). Meanwhile the vector leg ranks the previous model's
queries against ``embedding_previous`` (an exact scan of the user's chunks: there is no index
on it) when the node can embed them with that model (:mod:`memory.embedders.previous`), else
hybrid search is keyword-only and says why; the new model's vectors fill in behind it. A chunk
written or re-cut meanwhile gets the previous model's vector from the cache when that model
embedded its text (a full reindex keeps the leg whole); else keyword alone finds it. The pass
that finds no chunk pending ends the rebuild (:func:`end_rebuild`): the previous vectors and keys
go. Every node reads the state from ``meta`` (:func:`rebuild_state`) after each of its passes.

**The node started last decides.** A node makes its identity the stored one once, at its first
pass (the indexer's ``ensure_identity``); a different identity stored after that was set by a
node started later, whose setting is the newer one, so this node does not change it back
(before, two settings undid each other's change at every pass, each time emptying every
vector and dropping the index). Such a node is :class:`Superseded`: it fills no vector, and its
own model's queries rank against ``embedding_previous`` while they are still its own model's
(the rebuild it was replaced by runs), else its hybrid search is keyword-only and says why.
A CLI command (``decides_embedder`` False) never changes a stored identity: with another one
it is such a node from its start; where none is stored it records its own (a first build undoes
nothing).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from psycopg import AsyncConnection
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from memory.embedders.previous import (
    EmbedderIdentity,
    RebuildState,
    complete_identity,
)
from memory.embedders.previous import rebuild_state as rebuild_state_of
from memory.pg.migrations import MIGRATION_LOCK
from memory.quantize import quantize_int8

__all__ = ["FILL_SQL", "PENDING_SQL", "Superseded", "VectorLeg", "clear_previous",
           "drop_vector_index", "end_rebuild", "ensure_vector_index", "fill_previous",
           "holds_identity", "index_name", "previous_dims", "previous_dims_of", "rebuild_state",
           "record_first", "start_rebuild", "store_in_cache", "superseded", "vector_dims"]

# The indexer's embedding batches (memory.pg.indexer): which texts are pending, and the fill of
# chunks from the shared cache.
# Each node walks the pending texts in its own (salted) order, so two nodes start on different
# texts instead of both waiting on the locks of the same first batch.
PENDING_SQL = """
SELECT vector_hash, content FROM (
  SELECT DISTINCT ON (vector_hash) vector_hash, content FROM recalld_memory_chunks
  WHERE embedding IS NULL ORDER BY vector_hash) AS pending
ORDER BY md5(vector_hash || %s) LIMIT %s
"""

# Chunks whose text is in the cache get its vector; int8 bytes become a halfvec of the same
# integers, so cosine over it is SQLite's int8 cosine exactly.
FILL_SQL = """
UPDATE recalld_memory_chunks c
SET embedding = recalld_memory_int8_halfvec(e.vector)
FROM recalld_memory_embedding_cache e
WHERE c.embedding IS NULL AND c.vector_hash = ANY(%(hashes)s)
  AND e.provider = %(provider)s AND e.model = %(model)s AND e.endpoint_hash = %(endpoint_hash)s
  AND e.content_hash = c.vector_hash
"""

_CACHE_SQL = ("INSERT INTO recalld_memory_embedding_cache (provider, model, endpoint_hash, "
              "content_hash, dims, vector) VALUES (%(provider)s, %(model)s, %(endpoint_hash)s, "
              "%(content_hash)s, %(dims)s, %(vector)s) ON CONFLICT DO NOTHING")

# During a rebuild, the chunks the indexer just wrote get the previous model's vector of their
# text from the cache, as SQLite's previous leg reads it there: a full reindex or a re-cut
# leaves the previous leg whole. The text that model was sent may be the redacted one or not.
# The identity is bound (fill_previous): read from the meta row in the statement, it kept the
# planner from using the cache's key, a scan of the cache per chunk (142 s for one batch of
# 6,400 chunks over 300k cached vectors, as a review measured it; bound, milliseconds).
_PREVIOUS_FILL_SQL = """
UPDATE recalld_memory_chunks c
SET embedding_previous = recalld_memory_int8_halfvec(e.vector)
FROM unnest(%(keys)s::text[], %(idxs)s::int[]) AS w(session_key, chunk_idx),
     recalld_memory_embedding_cache e
WHERE c.session_key = w.session_key AND c.chunk_idx = w.chunk_idx
  AND c.embedding_previous IS NULL
  AND e.provider = %(provider)s AND e.model = %(model)s AND e.endpoint_hash = %(endpoint_hash)s
  AND e.content_hash IN (c.vector_hash, c.content_hash)
"""

_REBUILD_KEYS = ("vector_rebuild", "embedder_previous", "vector_dims_previous")

VectorLeg = Literal["hnsw", "bit"]

# HNSW build settings: pgvector's defaults (m 16, ef_construction 64).
_HNSW_SQL = ("CREATE INDEX IF NOT EXISTS {name} ON recalld_memory_chunks "
             "USING hnsw ((embedding::halfvec({dims})) halfvec_cosine_ops)")


def index_name(dims: int) -> str:
    return f"recalld_memory_chunks_hnsw_{int(dims)}"


async def vector_dims(conn: AsyncConnection[TupleRow]) -> int | None:
    row = await (await conn.execute("SELECT value FROM recalld_memory_meta "
                                    "WHERE key = 'vector_dims'")).fetchone()
    return int(row[0]) if row else None


async def ensure_vector_index(conn: AsyncConnection[TupleRow], leg: VectorLeg = "hnsw") -> None:
    """Create the index for the stored vectors' width, once across nodes (its own transaction:
    run it outside any transaction that has written chunks, or two nodes could deadlock)."""
    if await vector_dims(conn) is not None:
        return
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        # After an embedder change in progress (start_rebuild holds this row): the width read
        # below is then the new model's, never the one the change is emptying.
        await conn.execute("SELECT 1 FROM recalld_memory_meta WHERE key = 'embedder' FOR SHARE")
        if await vector_dims(conn) is not None:
            return
        row = await (await conn.execute(
            "SELECT vector_dims(embedding) FROM recalld_memory_chunks "
            "WHERE embedding IS NOT NULL LIMIT 1"
        )).fetchone()
        if row is None:
            return
        dims = int(row[0])
        if leg == "hnsw":
            # dims is the embedder's width read back from a stored vector, never a request value.
            await conn.execute(_HNSW_SQL.format(name=index_name(dims), dims=dims).encode())
        await conn.execute("INSERT INTO recalld_memory_meta(key, value) VALUES ('vector_dims', %s) "
                           "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (str(dims),))


async def drop_vector_index(conn: AsyncConnection[TupleRow]) -> None:
    """Within the caller's transaction: the width may change with the embedder."""
    dims = await vector_dims(conn)
    if dims is not None:
        await conn.execute(f"DROP INDEX IF EXISTS {index_name(dims)}".encode())
        await conn.execute("DELETE FROM recalld_memory_meta WHERE key = 'vector_dims'")


async def _meta(conn: AsyncConnection[TupleRow], *keys: str) -> dict[str, str]:
    rows = await (await conn.execute("SELECT key, value FROM recalld_memory_meta "
                                     "WHERE key = ANY(%s)", (list(keys),))).fetchall()
    return {str(k): str(v) for k, v in rows}


async def _set_meta(conn: AsyncConnection[TupleRow], key: str, value: str | None) -> None:
    if value is None:
        await conn.execute("DELETE FROM recalld_memory_meta WHERE key = %s", (key,))
        return
    await conn.execute("INSERT INTO recalld_memory_meta(key, value) VALUES (%s, %s) "
                       "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (key, value))


async def _lock_embedder(conn: AsyncConnection[TupleRow]) -> str | None:
    """``meta.embedder``, its row locked for the caller's transaction (None: not recorded).
    Every change of the rebuild state takes this row first, so two nodes' changes queue."""
    row = await (await conn.execute("SELECT value FROM recalld_memory_meta "
                                    "WHERE key = 'embedder' FOR UPDATE")).fetchone()
    return str(row[0]) if row is not None else None


async def store_in_cache(conn: AsyncConnection[TupleRow], identity: EmbedderIdentity,
                         vectors: dict[str, list[float]]) -> None:
    """``identity``'s vectors of some texts (by content hash) into the shared cache, as int8."""
    if not vectors:
        return
    params = {"provider": identity.provider, "model": identity.model,
              "endpoint_hash": identity.endpoint_hash}
    async with conn.cursor() as cur:
        await cur.executemany(_CACHE_SQL, [
            {**params, "content_hash": h, "dims": len(v), "vector": quantize_int8(v)}
            for h, v in vectors.items()])


async def fill_previous(conn: AsyncConnection[TupleRow],
                        chunks: Sequence[tuple[str, int]]) -> None:
    """During a rebuild, the previous vectors of these (session, chunk index) from the cache
    (``_PREVIOUS_FILL_SQL``); outside one, nothing (one read of a meta key)."""
    previous = EmbedderIdentity.from_json(
        (await _meta(conn, "embedder_previous")).get("embedder_previous"))
    if previous is None or not chunks:
        return
    await conn.execute(_PREVIOUS_FILL_SQL, {
        "keys": [k for k, _ in chunks], "idxs": [i for _, i in chunks],
        "provider": previous.provider, "model": previous.model,
        "endpoint_hash": previous.endpoint_hash})


async def record_first(conn: AsyncConnection[TupleRow], identity: EmbedderIdentity) -> bool:
    """Record ``identity`` where none is (no row, or the '' of a node without an embedder): a
    command's first build, which undoes nothing. One statement, so a node recording its own at
    the same moment is never replaced (the later of the two changes nothing). True when
    recorded here."""
    row = await (await conn.execute(
        "INSERT INTO recalld_memory_meta(key, value) VALUES ('embedder', %s) "
        "ON CONFLICT (key) DO UPDATE SET value = excluded.value "
        "WHERE recalld_memory_meta.value = '' RETURNING 1", (identity.to_json(),))).fetchone()
    return row is not None


async def start_rebuild(conn: AsyncConnection[TupleRow], identity: EmbedderIdentity) -> bool:
    """Make ``identity`` the one ``embedding`` holds (module docstring); False when it already
    was. In the caller's transaction. The row lock is taken only for a change: it waits for
    every node's embedding batch in flight (each holds the row ``FOR SHARE``, see
    :func:`holds_identity`)."""
    current = (await _meta(conn, "embedder")).get("embedder")
    if current == identity.to_json():
        return False
    stored = await _lock_embedder(conn)
    if stored == identity.to_json():
        return False
    # The change rewrites every chunk once: at a million chunks that outlasts the per-statement
    # bound meant for requests ([storage] statement_timeout_s), which would refuse it at every
    # pass and leave the rebuild never started.
    await conn.execute("SET LOCAL statement_timeout = 0")
    meta = await _meta(conn, *_REBUILD_KEYS)
    previous: EmbedderIdentity | None = None
    # The complete identity's vectors are still in ``embedding`` unless a rebuild was running.
    moved = "vector_rebuild" not in meta
    if stored:   # not a first build ('' was a node without an embedder, which stored nothing)
        previous = complete_identity(stored, not moved, meta.get("embedder_previous"))
        if previous == identity:
            previous = None   # switching back: the cache rebuilds it at once
    if previous is None:
        await conn.execute("UPDATE recalld_memory_chunks SET embedding = NULL, "
                           "embedding_previous = NULL "
                           "WHERE embedding IS NOT NULL OR embedding_previous IS NOT NULL")
        await _set_meta(conn, "embedder_previous", None)
        await _set_meta(conn, "vector_dims_previous", None)
    elif moved:
        width = await (await conn.execute(
            "SELECT vector_dims(embedding) FROM recalld_memory_chunks "
            "WHERE embedding IS NOT NULL LIMIT 1")).fetchone()
        await conn.execute("UPDATE recalld_memory_chunks SET embedding_previous = embedding, "
                           "embedding = NULL "
                           "WHERE embedding IS NOT NULL OR embedding_previous IS NOT NULL")
        await _set_meta(conn, "embedder_previous", previous.to_json())
        await _set_meta(conn, "vector_dims_previous", str(width[0]) if width else None)
    else:
        await conn.execute(
            "UPDATE recalld_memory_chunks SET embedding = NULL WHERE embedding IS NOT NULL")
    await drop_vector_index(conn)
    await _set_meta(conn, "embedder", identity.to_json())
    await _set_meta(conn, "vector_rebuild", "1" if stored else None)
    return True


# Chunk ids per statement clearing the previous vectors after a rebuild: short statements, so
# none meets the pool's statement timeout or holds many rows an indexing batch may want.
_CLEAR_IDS = 10_000


async def end_rebuild(conn: AsyncConnection[TupleRow], identity: EmbedderIdentity) -> bool:
    """End ``identity``'s rebuild once no chunk is pending: its keys go in one short transaction
    (from then on nothing reads the previous vectors), then the previous vectors, a range of
    chunk ids per statement. True when it ended here."""
    rebuilding = "vector_rebuild" in await _meta(conn, "vector_rebuild")
    await conn.rollback()   # the read's own transaction: the one below must be a real one
    if not rebuilding:
        return False   # the common case, every pass: no lock taken
    async with conn.transaction():
        if await _lock_embedder(conn) != identity.to_json():
            return False
        if "vector_rebuild" not in await _meta(conn, "vector_rebuild"):
            return False
        pending = await (await conn.execute(
            "SELECT EXISTS (SELECT 1 FROM recalld_memory_chunks WHERE embedding IS NULL)"
        )).fetchone()
        if pending is None or pending[0]:
            return False
        for key in _REBUILD_KEYS:
            await _set_meta(conn, key, None)
    await clear_previous(conn)
    return True


async def clear_previous(conn: AsyncConnection[TupleRow]) -> None:
    """NULL ``embedding_previous`` everywhere, ``_CLEAR_IDS`` ids per committed statement (what
    an interruption leaves is never read, and the next change overwrites it)."""
    row = await (await conn.execute("SELECT min(id), max(id) FROM recalld_memory_chunks "
                                    "WHERE embedding_previous IS NOT NULL")).fetchone()
    await conn.commit()
    if row is None or row[0] is None:
        return
    low, high = int(row[0]), int(row[1])
    while low <= high:
        async with conn.transaction():
            await conn.execute("UPDATE recalld_memory_chunks SET embedding_previous = NULL "
                               "WHERE id >= %s AND id < %s AND embedding_previous IS NOT NULL",
                               (low, low + _CLEAR_IDS))
        low += _CLEAR_IDS


async def holds_identity(conn: AsyncConnection[TupleRow], identity: EmbedderIdentity) -> bool:
    """Whether ``embedding`` is ``identity``'s, the row kept so (``FOR SHARE``) until the caller's
    transaction ends: a node of another model must not fill vectors once a change began."""
    row = await (await conn.execute("SELECT value FROM recalld_memory_meta "
                                    "WHERE key = 'embedder' FOR SHARE")).fetchone()
    return row is not None and str(row[0]) == identity.to_json()


async def rebuild_state(conn: AsyncConnection[TupleRow],
                        identity: EmbedderIdentity | None) -> RebuildState:
    """Whether ``identity``'s vectors are still to be (re)built after an identity change, and
    the identity whose complete vectors serve meanwhile (SQLite's rule, ``VectorStore``)."""
    meta = await _meta(conn, "embedder", "vector_rebuild", "embedder_previous")
    return rebuild_state_of(identity, meta.get("embedder"), "vector_rebuild" in meta,
                            meta.get("embedder_previous"))


@dataclass(frozen=True, slots=True)
class Superseded:
    """A node whose embedder another node, started after it, replaced (module docstring)."""

    current: EmbedderIdentity   # the one ``embedding`` is for now
    own_dims: int | None        # the width of this node's vectors in ``embedding_previous``,
                                # None when they are not there (the rebuild ended, or another)
    command: bool = False       # a CLI command, which never decides the embedder, not a node

    @property
    def reason(self) -> str:
        name = f"{self.current.provider} {self.current.model}"
        then = ("its model ranks against its own earlier vectors until the rebuild ends"
                if self.own_dims is not None else "hybrid search is keyword-only")
        if self.command:
            return (f"the cluster's embedder is {name}, not this command's: it embeds nothing "
                    f"and leaves new chunks to the nodes; {then}")
        return (f"a node started later changed the cluster's embedder to {name}: {then}; "
                "restart this node with that embedder")


async def superseded(conn: AsyncConnection[TupleRow], identity: EmbedderIdentity, *,
                     command: bool = False) -> Superseded | None:
    """Whether the stored identity is another than ``identity`` (for a node that made its own the
    stored one before, or a ``command``: see the module docstring)."""
    meta = await _meta(conn, "embedder", "vector_rebuild", "embedder_previous",
                       "vector_dims_previous")
    current = EmbedderIdentity.from_json(meta.get("embedder"))
    if current is None or current == identity:
        return None
    own = ("vector_rebuild" in meta and meta.get("embedder_previous") == identity.to_json()
           and meta.get("vector_dims_previous"))
    return Superseded(current, int(own) if own else None, command)


async def previous_dims(conn: AsyncConnection[TupleRow]) -> int | None:
    """The width of the vectors in ``embedding_previous`` (None: none are kept)."""
    value = (await _meta(conn, "vector_dims_previous")).get("vector_dims_previous")
    return int(value) if value else None


def previous_dims_of(pool: AsyncConnectionPool[AsyncConnection[TupleRow]]
                     ) -> Callable[[EmbedderIdentity], Awaitable[int | None]]:
    """How :class:`~memory.embedders.previous.PreviousModel` reads the width of the previous
    vectors (one column holds them, whichever identity it asks for)."""
    async def dims_of(_: EmbedderIdentity) -> int | None:
        async with pool.connection() as conn:
            return await previous_dims(conn)
    return dims_of
