"""The vector leg's index, created once the embedder's width is known.

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
"""

from __future__ import annotations

from typing import Literal

from psycopg import AsyncConnection
from psycopg.rows import TupleRow

from memory.pg.migrations import MIGRATION_LOCK

__all__ = ["VectorLeg", "drop_vector_index", "ensure_vector_index", "index_name", "vector_dims"]

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
