"""The vector leg's in-memory sign-bit pre-filter (memory.sqlite.index.knn): exact on small corpora,
filters, freshness after writes, restart and embedder change, and the sqlite-vec layout it reads."""

from __future__ import annotations

import array
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import numpy
import pytest

import memory.sqlite.search as search_module
from memory.chunking import iso_to_ms
from memory.quantize import quantize_int8
from memory.sqlite.index import knn, vectors
from memory.sqlite.index.db import open_index
from memory.sqlite.service import MemoryService
from tests.memory.conftest import (
    FakeEmbedder,
    append_messages,
    fake_vector,
    name_of,
    opened,
    quiet_config,
    session_key,
    ts,
    write_transcript,
)

SMALL = {"chunk_tokens": 16, "overlap_tokens": 0}
# Pools far below the corpus size, so that the pre-filter really cuts (see ``tiny_pool``).
CUT = {**SMALL, "candidates": 10, "max_k": 10, "default_k": 5}
WORDS = ["rust", "borrow", "sourdough", "starter", "tide", "sailing", "violin", "rosin", "tax",
         "deadline", "marathon", "training", "garden", "tomato", "piano", "scales"]
DIMS = 64


def messages(seed: int, n: int = 10) -> list[str]:
    return [" ".join(WORDS[(seed * 7 + i * 3 + j * 5) % len(WORDS)] for j in range(4))
            + f" n{seed}x{i}"
            for i in range(n)]


def corpus(tmp_path: Path, sessions: int = 6, user: str = "alice") -> None:
    for s in range(sessions):
        write_transcript(tmp_path, user, f"{user}{s}", messages(s), start_minute=s * 100)


def int8_cosine(a: bytes, b: bytes) -> float:
    x, y = array.array("b", a), array.array("b", b)
    dot = sum(p * q for p, q in zip(x, y))
    return dot / (math.sqrt(sum(p * p for p in x)) * math.sqrt(sum(q * q for q in y)))


def exact(data_dir: Path, user: str, query: str, k: int, where: str = "",
          params: tuple[object, ...] = ()) -> list[int]:
    """The exact top-k by int8 cosine over every embedded chunk matching ``where`` (brute force)."""
    db = apsw.Connection(str(data_dir / "memory.db"), flags=apsw.SQLITE_OPEN_READONLY)
    q = quantize_int8(fake_vector(query, DIMS))
    scored = sorted(
        ((-int8_cosine(bytes(vec), q), cid) for cid, vec in db.execute(
            "SELECT chunks.id, embedding_cache.vector FROM chunks JOIN embedding_cache "
            "ON embedding_cache.content_hash = chunks.content_hash "
            f"WHERE chunks.embedded = 1 AND chunks.user = ?{where}", (user, *params))))
    db.close()
    return [cid for _, cid in scored[:k]]


@pytest.fixture
def tiny_pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A Hamming scan of 20 and a pool of 12 (with ``CUT``'s 10 candidates) out of ~80 chunks."""
    monkeypatch.setattr(search_module, "RERANK_SCAN", 20)
    monkeypatch.setattr(search_module, "RERANK_POOL", 12)
    yield


async def vector_ids(svc: MemoryService, user: str, query: str, k: int = 10,
                     **kw: Any) -> list[int]:
    response = await svc.search(user, query, k=k, mode="vector", **kw)
    assert response.mode == "vector", response.fallback_reason
    return [h.chunk_id for h in response.results]


async def test_small_corpus_gets_the_exact_top_k(tmp_path: Path) -> None:
    """With the default pools and a corpus smaller than them, the vector leg is the exact top-k."""
    corpus(tmp_path)
    async with opened(tmp_path, quiet_config(**SMALL), FakeEmbedder(dims=DIMS)) as svc:
        for query in ("sourdough starter", "violin rosin scales", "tax deadline marathon"):
            assert await vector_ids(svc, "alice", query) == exact(tmp_path, "alice", query, 10)


async def test_pre_filter_keeps_the_true_neighbours(tmp_path: Path, tiny_pool: None) -> None:
    """Cutting ~80 chunks to a Hamming scan of 20 and a pool of 12 still finds the exact best
    match of queries that are one message of a chunk."""
    corpus(tmp_path)
    async with opened(tmp_path, quiet_config(**CUT), FakeEmbedder(dims=DIMS)) as svc:
        for seed in (0, 3, 5):
            query = messages(seed)[4]
            got = await vector_ids(svc, "alice", query, k=3)
            assert got[0] == exact(tmp_path, "alice", query, 1)[0]
            assert len(got) == 3


async def test_filters_are_applied_before_the_pool_is_cut(tmp_path: Path, tiny_pool: None) -> None:
    """session, exclude, time and user filters: every hit matches, and none is lost to the cut."""
    corpus(tmp_path)
    corpus(tmp_path, sessions=2, user="bob")
    query = "sourdough starter tide"
    async with opened(tmp_path, quiet_config(**CUT), FakeEmbedder(dims=DIMS)) as svc:
        only = await vector_ids(svc, "alice", query, k=10, session_key=session_key("alice2"))
        assert only == exact(tmp_path, "alice", query, 10, " AND session_key = ?",
                             (session_key("alice2"),))
        assert only
        excluded = await vector_ids(svc, "alice", query, k=10,
                                    exclude_session_key=session_key("alice2"))
        assert excluded
        assert not set(excluded) & set(exact(tmp_path, "alice", query, 99, " AND session_key = ?",
                                              (session_key("alice2"),)))
        window = await vector_ids(svc, "alice", query, k=10, after=ts(205), before=ts(305))
        hits = (await svc.search("alice", query, k=10, mode="vector", after=ts(205),
                                 before=ts(305))).results
        assert {name_of(h.session_key) for h in hits} == {"alice2", "alice3"}
        in_window = exact(tmp_path, "alice", query, 99, " AND end_ms >= ? AND start_ms < ?",
                          (iso_to_ms(ts(205)), iso_to_ms(ts(305))))
        assert set(window) <= set(in_window) and len(window) == min(10, len(in_window))
        bob = await svc.search("bob", query, k=10, mode="vector")
        assert bob.results and {name_of(h.session_key) for h in bob.results} <= {"bob0", "bob1"}


async def test_writes_are_seen_by_the_next_search_without_a_reload(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An appended message and a deleted session show in the very next search; the partition
    loaded once is brought up to date from the change log, not reloaded."""
    corpus(tmp_path)
    loads: list[str] = []
    real_load = knn.SignIndex._load

    def counting_load(self: knn.SignIndex, db: apsw.Connection, user: str, width: int,
                      snapshot: knn._Snapshot) -> knn._Partition:
        loads.append(user)
        return real_load(self, db, user, width, snapshot)

    monkeypatch.setattr(knn.SignIndex, "_load", counting_load)
    async with opened(tmp_path, quiet_config(**SMALL), FakeEmbedder(dims=DIMS)) as svc:
        await vector_ids(svc, "alice", "piano")
        assert loads == ["alice"]
        append_messages(tmp_path / "sessions" / "alice" / f"{session_key('alice1')}.jsonl",
                        ["zebra quagga okapi unique"], start_minute=900)
        await svc.sync_now()
        hits = (await svc.search("alice", "zebra quagga okapi unique", k=1, mode="vector")).results
        assert "zebra" in hits[0].content
        removed = await svc.delete_session("alice", session_key("alice1"))
        assert removed
        after = (await svc.search("alice", "zebra quagga okapi unique", k=50,
                                  mode="vector")).results
        assert all(name_of(h.session_key) != "alice1" for h in after)
        assert len(after) == len(exact(tmp_path, "alice", "x", 50))
        assert loads == ["alice"]


async def test_restart_and_embedder_change_reload(tmp_path: Path) -> None:
    """A restarted service rebuilds the in-memory index from SQLite; a new embedder's vectors
    (a new generation) are never scanned with the old bits."""
    corpus(tmp_path)
    query = "garden tomato"
    async with opened(tmp_path, quiet_config(**SMALL), FakeEmbedder(dims=DIMS)) as svc:
        first = await vector_ids(svc, "alice", query)
    async with opened(tmp_path, quiet_config(**SMALL), FakeEmbedder(dims=DIMS)) as svc:
        assert await vector_ids(svc, "alice", query) == first
    wider = FakeEmbedder(dims=128, model_id="fake-wide")
    async with opened(tmp_path, quiet_config(**SMALL), wider) as svc:
        hits = (await svc.search("alice", query, k=5, mode="vector")).results
        assert len(hits) == 5


async def test_restart_loads_sign_bits_before_the_first_search(tmp_path: Path) -> None:
    """A restarted service loads every user's sign bits at start (before its catch-up sync), and
    its searches answer exactly as the first service's lazily loaded index did."""
    corpus(tmp_path)
    corpus(tmp_path, sessions=3, user="bob")
    queries = ("garden tomato", "violin rosin", "tax deadline")
    async with opened(tmp_path, quiet_config(**SMALL), FakeEmbedder(dims=DIMS)) as svc:
        before = {(u, q): await vector_ids(svc, u, q) for u in ("alice", "bob") for q in queries}
    assert svc.sign_index_bytes == 0  # released at close
    async with opened(tmp_path, quiet_config(**SMALL), FakeEmbedder(dims=DIMS)) as svc:
        warmed = svc.sign_index_bytes
        assert warmed > 0
        after = {(u, q): await vector_ids(svc, u, q) for u in ("alice", "bob") for q in queries}
        assert svc.sign_index_bytes == warmed  # nothing loaded by a search
    assert after == before


async def test_trimmed_change_log_reloads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A partition further behind than the kept log is reloaded, and is then current."""
    monkeypatch.setattr(vectors, "CHANGES_KEPT", 1)
    corpus(tmp_path)
    async with opened(tmp_path, quiet_config(**SMALL), FakeEmbedder(dims=DIMS)) as svc:
        await vector_ids(svc, "alice", "piano")
        write_transcript(tmp_path, "alice", "late",
                         ["zebra quagga okapi", "more zebra talk", "okapi facts"],
                         start_minute=2000)
        await svc.sync_now()
        hits = (await svc.search("alice", "zebra quagga okapi", k=1, mode="vector")).results
        assert name_of(hits[0].session_key) == "late"


async def test_without_numpy_sqlite_vec_knn_serves(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Without numpy the vector leg falls back to sqlite-vec's KNN and gives the same top hits."""
    corpus(tmp_path)
    async with opened(tmp_path, quiet_config(**SMALL), FakeEmbedder(dims=DIMS)) as svc:
        with_numpy = await vector_ids(svc, "alice", "sourdough starter", k=5)
        monkeypatch.setattr(knn, "HAVE_NUMPY", False)
        assert await vector_ids(svc, "alice", "sourdough starter", k=5) == with_numpy


async def test_shadow_load_matches_the_public_interface(tmp_path: Path) -> None:
    """Reading vec0's shadow tables gives exactly the rows ``SELECT … FROM chunks_vec`` does
    (pins the sqlite-vec layout named in KNOWN_LAYOUTS), including deleted slots."""
    corpus(tmp_path)
    async with opened(tmp_path, quiet_config(**SMALL), FakeEmbedder(dims=DIMS)) as svc:
        await svc.delete_session("alice", session_key("alice3"))
    db = open_index(tmp_path / "memory.db", readonly=True).db
    with db:
        shadow = knn._load_shadow(db, "alice", DIMS // 8)
        public = knn._load_public(db, "alice", DIMS // 8)
        (live,) = db.execute(  # type: ignore[misc]
            "SELECT count(*) FROM chunks WHERE user = 'alice' AND embedded = 1").fetchone()
    assert shadow is not None
    order_s, order_p = numpy.argsort(shadow[0]), numpy.argsort(public[0])
    for a, b in zip(shadow, public):
        assert numpy.array_equal(a[order_s], b[order_p])
    assert len(public[0]) == live


def test_query_sign_bits_match_sqlite_vec() -> None:
    """The scan's query bits are what vec_quantize_binary stores for the same int8 vector."""
    db = open_index(Path(":memory:")).db
    q = quantize_int8(fake_vector("sign bits of a query", DIMS))
    (stored,) = db.execute("SELECT vec_quantize_binary(vec_int8(?))", (q,)).fetchone()  # type: ignore[misc]
    ours = numpy.packbits(numpy.frombuffer(q, numpy.int8) > 0, bitorder="little").tobytes()
    assert ours == bytes(stored)


def test_the_scan_grows_with_its_share_of_the_partition() -> None:
    """A neighbour that Hamming distance ranks last is found once the scan covers its share of
    the rows (a fixed scan misses it): the share, not a fixed count, bounds what is scanned."""
    dims = 64
    query = numpy.array([127] * 8 + [1] * (dims - 8), dtype=numpy.int8)
    # 50 decoys agree with the query's sign on every small dimension and on half of the
    # large ones (Hamming distance 4); the true neighbour agrees on the large ones only
    # (distance 56) but has by far the larger dot product with the query.
    decoy = numpy.array([1, 0] * 4 + [1] * (dims - 8), dtype=numpy.uint8)
    best = numpy.array([1] * 8 + [0] * (dims - 8), dtype=numpy.uint8)
    signs = numpy.stack([decoy] * 50 + [best])
    bits = numpy.packbits(signs, axis=1, bitorder="little")
    n = len(signs)
    part = knn._Partition(dims // 8, numpy.arange(1, n + 1, dtype=numpy.int64), bits,
                          numpy.zeros(n, numpy.int64), numpy.zeros(n, numpy.int64),
                          knn._Snapshot(None, 0, 0))
    assert part.nearest(query, 10, 1, knn.Filters()) != [n]
    assert part.nearest(query, 10, 1, knn.Filters(), scan_share=1.0) == [n]


async def test_overlapped_legs_rank_as_the_legs_in_turn_do(tmp_path: Path, tiny_pool: None,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """With the overlap on (threshold 1) the vector scan runs on its own thread beside the keyword
    leg, and hybrid results, filtered or not, are the ones the legs give one after the other."""
    corpus(tmp_path)
    threads: list[str] = []
    run = knn.PreparedScan.run

    def recorded(self: knn.PreparedScan) -> list[int]:
        threads.append(threading.current_thread().name)
        return run(self)

    monkeypatch.setattr(knn.PreparedScan, "run", recorded)
    queries: list[tuple[str, dict[str, Any]]] = [
        ("sourdough starter tide", {}), ("violin rosin", {"session_key": session_key("alice2")}),
        ("tax deadline", {"after": ts(205), "before": ts(405)})]
    results: dict[int, list[list[int]]] = {}
    for threshold in (0, 1):
        async with opened(tmp_path, quiet_config(**CUT, overlap_min_chunks=threshold),
                          FakeEmbedder(dims=DIMS)) as svc:
            results[threshold] = []
            for query, filters in queries:
                response = await svc.search("alice", query, k=10, **filters)
                assert response.mode == "hybrid", response.fallback_reason
                results[threshold].append([h.chunk_id for h in response.results])
        if threshold == 0:
            assert threads and not any(t.startswith("recalld-scan") for t in threads)
            threads.clear()
    assert results[1] == results[0] and all(results[0])
    assert len(threads) == len(queries) and all(t.startswith("recalld-scan") for t in threads)
