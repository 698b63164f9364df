"""Quantized vector storage: int8 cache, sign-bit KNN with an exact re-rank, the m002 upgrade."""

from __future__ import annotations

import array
import math
from pathlib import Path

import apsw

from memory.quantize import quantize_int8, vector_to_blob
from tests.memory.conftest import FakeEmbedder, MemoryBackend, fake_vector, opened, quiet_config

SMALL = {"chunk_tokens": 24, "overlap_tokens": 6}
TOPICS = ["rust borrow checker lifetimes", "sourdough starter hydration", "tide tables sailing",
          "violin bow rosin", "tax return deadline", "marathon training plan"]


def corpus(tmp_path: Path) -> None:
    _corpus(MemoryBackend("sqlite", tmp_path))


def _corpus(memory_backend: MemoryBackend) -> None:
    for i, topic in enumerate(TOPICS):
        memory_backend.write("alice", f"s{i}", [f"{topic} note {n}" for n in range(6)])


def cosine(a: list[float], b: list[float]) -> float:
    return (sum(x * y for x, y in zip(a, b))
            / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))))


def test_quantize_int8_keeps_signs_and_cosine() -> None:
    """int8 with a per-vector scale keeps every sign and the cosine to within rounding."""
    v = fake_vector("some words to embed here", 64)
    w = fake_vector("other words to embed", 64)
    q = array.array("b", quantize_int8(v)).tolist()
    assert all((x > 0) == (y > 0) for x, y in zip(v, q) if abs(x) > 0.01)
    assert abs(cosine(q, array.array("b", quantize_int8(w)).tolist()) - cosine(v, w)) < 0.02  # type: ignore[arg-type]  # int8 values as floats


async def test_vectors_are_stored_once_as_int8_and_bits(tmp_path: Path) -> None:
    """The cache holds one byte per dimension; chunks_vec is bit[D]; vector_hash stays NULL without
    redaction."""
    corpus(tmp_path)
    async with opened(tmp_path, quiet_config(**SMALL), FakeEmbedder(dims=64)):
        pass
    db = apsw.Connection(str(tmp_path / "memory.db"))
    lengths = {row[0] for row in db.execute("SELECT length(vector) FROM embedding_cache")}
    assert lengths == {64}
    assert db.execute("SELECT value FROM meta WHERE key = 'vector_format'").fetchone() == ("bit",)
    assert (db.execute("SELECT count(*) FROM chunks WHERE vector_hash IS NOT NULL").fetchone()
            == (0,))


async def test_vector_leg_ranks_by_exact_cosine(memory_backend: MemoryBackend) -> None:
    """Vector mode returns chunks in the order of their exact cosine to the query (ties aside)."""
    _corpus(memory_backend)
    query = "sourdough hydration starter"
    async with memory_backend.opened(quiet_config(**SMALL), FakeEmbedder(dims=64)) as svc:
        hits = (await svc.search("alice", query, k=10, mode="vector")).results
    qv = fake_vector(query, 64)
    scores = [cosine(qv, fake_vector(h.content, 64)) for h in hits]
    assert hits and "sourdough" in hits[0].content
    assert all(a >= b - 0.02 for a, b in zip(scores, scores[1:]))


async def test_m001_database_upgrades_from_cache_without_embedder_calls(tmp_path: Path) -> None:
    """A database written before m002 (float32 cache, no vector_hash) is converted and its vectors
    rebuilt from the cache: the embedder is never called for the stored texts."""
    corpus(tmp_path)
    async with opened(tmp_path, quiet_config(**SMALL), FakeEmbedder(dims=64)):
        pass
    db = apsw.Connection(str(tmp_path / "memory.db"))
    with db:  # turn it back into an m001 database
        for _provider, _model, _endpoint, chash in list(db.execute(
                "SELECT provider, model, endpoint_hash, content_hash FROM embedding_cache")):
            (content,) = db.execute(  # type: ignore[misc]
                "SELECT content FROM chunks WHERE content_hash = ? LIMIT 1", (chash,)).fetchone()
            db.execute("UPDATE embedding_cache SET vector = ? WHERE content_hash = ?",
                       (vector_to_blob(fake_vector(content, 64)), chash))
        db.execute("DELETE FROM migrations WHERE name = 'm002_quantized_vectors'")
        db.execute("ALTER TABLE chunks DROP COLUMN vector_hash")
        db.execute("DELETE FROM meta WHERE key = 'vector_format'")
    db.close()
    second = FakeEmbedder(dims=64)
    async with opened(tmp_path, quiet_config(**SMALL), second) as svc:
        status = await svc.status()
        hits = (await svc.search("alice", "violin rosin", k=3, mode="vector")).results
    assert second.texts == ["violin rosin"]  # only the query
    assert status["pending"] == 0 and status["embedded"] == status["chunks"]
    assert "violin" in hits[0].content
    db = apsw.Connection(str(tmp_path / "memory.db"))
    assert {row[0] for row in db.execute("SELECT length(vector) FROM embedding_cache")} == {64}
