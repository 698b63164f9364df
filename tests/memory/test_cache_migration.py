"""The m006 upgrade of the embedding cache: old rows are compacted and still rebuild the index."""

from __future__ import annotations

from pathlib import Path

import apsw

from memory.quantize import cached_vector_to_int8, vector_to_blob
from tests.memory.conftest import FakeEmbedder, fake_vector, opened, quiet_config, write_transcript

SMALL = {"chunk_tokens": 24, "overlap_tokens": 6}
TOPICS = ["rust borrow checker lifetimes", "sourdough starter hydration", "tide tables sailing",
          "violin bow rosin", "tax return deadline", "marathon training plan"]

# The cache table as m001 created it, which every database before m006 still has.
_M005_CACHE = """
CREATE TABLE embedding_cache(
    provider TEXT NOT NULL, model TEXT NOT NULL, endpoint_hash TEXT NOT NULL, content_hash TEXT NOT NULL,
    dims INTEGER NOT NULL, vector BLOB NOT NULL, created_at TEXT NOT NULL,
    PRIMARY KEY (provider, model, endpoint_hash, content_hash)
) WITHOUT ROWID
"""  # noqa: E501  (the m005 schema as it was written, byte for byte)

CacheRows = dict[tuple[str, str, str, str], tuple[int, bytes]]


def cache_rows(db: apsw.Connection) -> CacheRows:
    return {(p, m, e, h): (int(d), bytes(v)) for p, m, e, h, d, v in db.execute(
        "SELECT provider, model, endpoint_hash, content_hash, dims, vector FROM embedding_cache")}


def meta(path: Path, key: str) -> str | None:
    db = apsw.Connection(str(path))
    row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    db.close()
    return None if row is None else str(row[0])


def make_m005(path: Path) -> tuple[CacheRows, str, str]:
    """Turn an index back into an m005 database whose chunks_vec must be rebuilt from the cache;
    one cache row is float32, as one copied in from a cache written before m002 is. Returns the
    rows as they were, and the key hash and text of the float32 row."""
    db = apsw.Connection(str(path))
    rows = cache_rows(db)
    with db:
        db.execute("DROP TABLE embedding_cache")
        db.execute(_M005_CACHE)
        for (provider, model, endpoint, chash), (dims, vector) in rows.items():
            db.execute("INSERT INTO embedding_cache VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (provider, model, endpoint, chash, dims, vector,
                        "2026-11-20T10:00:00.000000+00:00"))
        row = db.execute("SELECT content_hash, content FROM chunks WHERE content LIKE '%violin%' "
                         "ORDER BY id LIMIT 1").fetchone()
        assert row is not None
        chash, content = str(row[0]), str(row[1])
        db.execute("UPDATE embedding_cache SET vector = ? WHERE content_hash = ?",
                   (vector_to_blob(fake_vector(content, 64)), chash))
        db.execute("DELETE FROM migrations WHERE name = 'm006_compact_cache'")
        db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('vectors_stale', '1')")
    db.close()
    return rows, chash, content


async def test_m005_cache_is_compacted_and_rebuilds_the_index_without_embedder_calls(
        tmp_path: Path) -> None:
    """m006 drops created_at, converts a float32 row to int8, keeps every int8 row byte for byte,
    and the index rebuilt from the converted cache ranks as before with no passage embedded."""
    for i, topic in enumerate(TOPICS):
        write_transcript(tmp_path, "alice", f"s{i}", [f"{topic} note {n}" for n in range(6)])
    async with opened(tmp_path, quiet_config(**SMALL), FakeEmbedder(dims=64)) as svc:
        before = [h.chunk_id
                  for h in (await svc.search("alice", "violin rosin", k=5, mode="vector")).results]
    rows, float_hash, float_text = make_m005(tmp_path / "memory.db")
    generation = meta(tmp_path / "memory.db", "vector_generation")

    second = FakeEmbedder(dims=64)
    async with opened(tmp_path, quiet_config(**SMALL), second) as svc:
        status = await svc.status()
        after = [h.chunk_id
                 for h in (await svc.search("alice", "violin rosin", k=5, mode="vector")).results]

    assert second.texts == ["violin rosin"]  # only the query: every vector came from the cache
    assert status["pending"] == 0 and status["embedded"] == status["chunks"]
    assert after == before
    assert meta(tmp_path / "memory.db", "vector_generation") != generation  # chunks_vec was rebuilt
    db = apsw.Connection(str(tmp_path / "memory.db"))
    columns = [row[1] for row in db.execute("PRAGMA table_info(embedding_cache)")]
    assert columns == ["provider", "model", "endpoint_hash", "content_hash", "dims", "vector"]
    assert (db.execute("SELECT 1 FROM migrations WHERE name = 'm006_compact_cache'").fetchone()
            == (1,))
    converted = cache_rows(db)
    assert converted.keys() == rows.keys()
    for key, (dims, vector) in rows.items():
        if key[3] == float_hash:
            expected = cached_vector_to_int8(vector_to_blob(fake_vector(float_text, 64)), 64)
            assert converted[key] == (dims, expected) and len(expected) == dims
        else:
            assert converted[key] == (dims, vector)


async def test_new_cache_rows_hold_key_width_and_int8_only(tmp_path: Path) -> None:
    """A fresh index writes cache rows of the m006 shape: one byte a dimension, no timestamp."""
    write_transcript(tmp_path, "alice", "s1", [f"{topic} note" for topic in TOPICS])
    async with opened(tmp_path, quiet_config(**SMALL), FakeEmbedder(dims=64)):
        pass
    db = apsw.Connection(str(tmp_path / "memory.db"))
    assert "created_at" not in [row[1] for row in db.execute("PRAGMA table_info(embedding_cache)")]
    assert {row[0] for row in db.execute("SELECT length(vector) FROM embedding_cache")} == {64}
