"""Searching the PostgreSQL index: FTS5's BM25 ranking, ``fuse``'s rule in one statement,
every filter in every mode, and both shapes of the vector leg agreeing."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from memory.config import MemoryConfig
from memory.embedders.embeddings import EmbeddingPipeline
from memory.pg.indexer import PgIndexer
from memory.pg.search import PgSearch, build_statement, statement_params
from memory.retrieval.fusion import fuse
from memory.retrieval.request import SearchHit, SearchRequest
from tests.memory.conftest import (
    BASE_TIME,
    FakeEmbedder,
    fake_vector,
    opened,
    quiet_config,
    session_key,
    write_transcript,
)
from tests.memory.pg.conftest import add_session

Pool = AsyncConnectionPool[AsyncConnection[TupleRow]]
CONFIG = quiet_config(chunk_tokens=24, overlap_tokens=0)

GARDEN = ["we planted tomatoes and basil in the garden", "the tomatoes need water every morning",
          "basil grows well beside tomatoes"]
TRAVEL = ["the train to the coast leaves at nine", "we booked a cabin near the coast",
          "the garden at the cabin has tomatoes too"]
WORK = ["the quarterly report is due on friday", "the report needs the sales figures",
        "friday meeting moved to the morning"]


async def indexed(pg_index: str, pool: Pool, config: MemoryConfig = CONFIG) -> FakeEmbedder:
    for name, messages, minute in (("garden", GARDEN, 0), ("travel", TRAVEL, 600),
                                   ("work", WORK, 1200)):
        add_session(pg_index, "alice", session_key(name), messages, start_minute=minute)
    add_session(pg_index, "bob", session_key("bob"), ["tomatoes and basil and the coast"],
                start_minute=0)
    embedder = FakeEmbedder()
    await PgIndexer(pool, config, EmbeddingPipeline(embedder)).run_once()
    return embedder


async def run(pool: Pool, query: str, mode: str, config: MemoryConfig = CONFIG, leg: Any = "hnsw",
              **filters: Any) -> list[SearchHit]:
    request = SearchRequest.build(config, filters.pop("user", "alice"), query,
                                  k=filters.pop("k", 10), mode=mode, **filters)
    vector = fake_vector(request.query, 64) if mode != "keyword" else None
    return await PgSearch(pool, config, vector_leg=leg).search(request, query_vector=vector,
                                                               keyword=mode != "vector")


@pytest.mark.parametrize("common", [None, (0.3, 1)])
async def test_keyword_leg_ranks_as_fts5_bm25(tmp_path: Path, pg_index: str, pool: Pool,
                                             common: tuple[float, int] | None) -> None:
    """On the same messages, the keyword leg returns the chunks the SQLite index returns, in the
    same order and with the same normalised scores (BM25 with FTS5's constants and statistics),
    also when words common in the index are left out (a share and floor small enough to
    act here)."""
    config = CONFIG if common is None else replace(CONFIG, keyword_common_share=common[0],
                                                    keyword_common_min_chunks=common[1])
    await indexed(pg_index, pool, config)
    for name, messages, minute in (("garden", GARDEN, 0), ("travel", TRAVEL, 600),
                                   ("work", WORK, 1200)):
        write_transcript(tmp_path, "alice", name, messages, start_minute=minute)
    write_transcript(tmp_path, "bob", "bob", ["tomatoes and basil and the coast"])
    changed = False
    async with opened(tmp_path, config, None) as svc:
        for query in ("tomatoes basil", "the report friday morning", "coast cabin garden", "water",
                      "tomatoes water", "tomatoes coast basil"):
            expected = (await svc.search("alice", query, mode="keyword", k=10)).results
            got = await run(pool, query, "keyword", config)
            changed |= ([h.score for h in got]
                        != [h.score for h in await run(pool, query, "keyword")])
            assert [h.content for h in got] == [h.content for h in expected], query
            assert [h.score for h in got] == pytest.approx([h.score for h in expected],
                                                           abs=1e-9), query
    assert changed == (common is not None)  # the small share did leave words out


@pytest.mark.parametrize("fusion", ["convex", "rrf"])
async def test_hybrid_statement_fuses_as_fuse_does(pg_index: str, pool: Pool, fusion: str) -> None:
    """The one hybrid statement gives exactly memory.retrieval.fusion.fuse of its two legs:
    the same chunks, order, scores and leg ranks."""
    config = replace(CONFIG, fusion=fusion)  # type: ignore[arg-type]
    await indexed(pg_index, pool, config)
    for query in ("tomatoes in the garden", "report on friday", "cabin"):
        keyword = await run(pool, query, "keyword", config, k=50)
        vector = await run(pool, query, "vector", config, k=50)
        expected = fuse(_raw(keyword, "keyword"), _raw(vector, "vector"), config)
        hybrid = await run(pool, query, "hybrid", config, k=50)
        assert [h.chunk_id for h in hybrid] == [f.chunk_id for f in expected], query
        assert [h.score for h in hybrid] == pytest.approx([f.score for f in expected],
                                                          abs=1e-9), query
        assert [(h.keyword_rank, h.vector_rank) for h in hybrid] == [
            (f.keyword_rank, f.vector_rank) for f in expected], query


def _raw(hits: list[SearchHit], leg: str) -> list[tuple[int, float]]:
    """A single-leg search's hits as the leg handed them over: best first, with a score whose
    min-max normalisation is the hit's score (so fuse normalises it back to the same value)."""
    if leg == "vector":
        return [(h.chunk_id, float(h.similarity or 0.0)) for h in hits]
    return [(h.chunk_id, h.score) for h in hits]


@pytest.mark.parametrize("mode", ["keyword", "vector", "hybrid"])
async def test_filters_apply_in_every_mode(pg_index: str, pool: Pool, mode: str) -> None:
    """User, session, excluded session and time range narrow every mode."""
    await indexed(pg_index, pool)
    everything = await run(pool, "tomatoes coast report", mode)
    assert ({h.session_key for h in everything}
            == {session_key(n) for n in ("garden", "travel", "work")})
    only = await run(pool, "tomatoes coast report", mode, session_key=session_key("travel"))
    assert only and {h.session_key for h in only} == {session_key("travel")}
    without = await run(pool, "tomatoes coast report", mode,
                        exclude_session_key=session_key("travel"))
    assert without and session_key("travel") not in {h.session_key for h in without}
    window = await run(pool, "tomatoes coast report", mode, after="2026-11-23T05:00:00Z",
                       before="2026-11-23T07:00:00Z")
    assert window and {h.session_key for h in window} == {session_key("work")}
    bob = await run(pool, "tomatoes coast report", mode, user="bob")
    assert {h.session_key for h in bob} == {session_key("bob")}


async def test_hnsw_and_bit_legs_agree_on_a_small_corpus(pg_index: str, pool: Pool) -> None:
    """Where the Hamming pool holds every chunk, the two shapes of the vector leg are the same
    exact cosine ranking."""
    await indexed(pg_index, pool)
    for query in ("tomatoes", "the report", "a train to the coast"):
        hnsw = await run(pool, query, "vector", leg="hnsw")
        bit = await run(pool, query, "vector", leg="bit")
        assert ([(h.chunk_id, h.similarity) for h in hnsw]
                == [(h.chunk_id, h.similarity) for h in bit])


async def test_a_search_runs_without_a_transaction_and_leaves_the_scan_settings_on_its_connection(
        pg_index: str) -> None:
    """A search outside a time window is its one statement in autocommit (no transaction left
    open, the connection handed back as it was taken); the connection then scans HNSW with
    ``hnsw.ef_search`` = max(400, 4 × candidates) and the relaxed iterative scan, also when a
    windowed search (its own snapshot) runs on it."""
    async with AsyncConnectionPool(pg_index, min_size=1, max_size=1, open=False) as one:
        await indexed(pg_index, one)
        config = replace(CONFIG, candidates=150)
        searcher = PgSearch(one, config)
        for query in ("tomatoes", f"tomatoes in {BASE_TIME:%B %Y}"):
            request = SearchRequest.build(config, "alice", query, k=5, mode="hybrid")
            assert (request.within_window() is not None) == (query != "tomatoes")
            hits = await searcher.search(request, query_vector=fake_vector(query, 64))
            assert hits and "tomatoes" in hits[0].content
            async with one.connection() as conn:
                assert not conn.autocommit
                assert conn.info.transaction_status == TransactionStatus.IDLE
                rows = await (await conn.execute("SELECT current_setting('hnsw.ef_search'), "
                                                 "current_setting('hnsw.iterative_scan')")
                              ).fetchone()
                await conn.rollback()
            assert rows == ("600", "relaxed_order")


async def test_the_statement_returns_k_rows_unless_the_recency_term_reorders_them_here(
        pg_index: str, pool: Pool) -> None:
    """Without the recency term the fused statement sends only the first ``k`` rows (their
    texts with them); with it, every fused row comes back for the re-ordering. A search's ``k``
    hits are the first ``k`` of a deeper one's."""
    await indexed(pg_index, pool)
    plain = SearchRequest.build(CONFIG, "alice", "tomatoes basil", k=2, mode="hybrid")
    recent = replace(plain, recency=True, now_ms=0)
    words = ["tomatoes", "basil"]
    async with pool.connection() as conn:
        counts = []
        for request in (plain, recent):
            sql = build_statement(request, keyword=True, dims=None, leg="hnsw")
            params = statement_params(CONFIG, request, words, None)
            counts.append(len(await (await conn.execute(sql.encode(), params)).fetchall()))
        await conn.rollback()
    assert counts[0] == 2 and counts[1] > 2
    assert [h.chunk_id for h in await run(pool, "tomatoes basil", "keyword", k=2)] == [
        h.chunk_id for h in (await run(pool, "tomatoes basil", "keyword", k=10))[:2]]


async def test_the_remembered_vector_width_is_read_again_when_another_node_changes_it(
        pg_index: str, pool: Pool) -> None:
    """A searcher reads the stored vectors' width once; when another node's embedder change has
    since stored vectors of another width, a search answers (keyword hits, no vector leg for
    a query of the old width) instead of failing, and a query of the new width gets the vector
    leg at once."""
    await indexed(pg_index, pool)
    searcher = PgSearch(pool, CONFIG)

    async def hits(query: str, dims: int) -> list[SearchHit]:
        request = SearchRequest.build(CONFIG, "alice", query, k=5, mode="hybrid")
        return await searcher.search(request, query_vector=fake_vector(query, dims))

    assert any(h.vector_rank is not None for h in await hits("tomatoes", 64))
    assert searcher._dims == 64
    async with pool.connection() as conn:   # what a node with a 32-wide embedder leaves
        await conn.execute("DROP INDEX IF EXISTS recalld_memory_chunks_hnsw_64")
        await conn.execute("UPDATE recalld_memory_chunks SET embedding = "
                           "array_fill(0.5, ARRAY[32])::halfvec")
        await conn.execute("UPDATE recalld_memory_meta SET value = '32' WHERE key = 'vector_dims'")
    stale = await hits("tomatoes", 64)
    assert stale and all(h.vector_rank is None for h in stale)
    assert searcher._dims == 32
    assert any(h.vector_rank is not None for h in await hits("tomatoes", 32))
