"""The vector leg on both backends, against the exact top-k computed here: a small corpus, every
filter, a filter that keeps a few chunks of a corpus larger than the leg's candidate lists
(SQLite's sign-bit pool, PostgreSQL's HNSW ``ef_search``), and writes seen by the next search."""

from __future__ import annotations

import math
import random
from typing import Any

from memory.quantize import quantize_int8
from tests.memory.conftest import (
    BackendMemory,
    FakeEmbedder,
    MemoryBackend,
    fake_vector,
    name_of,
    quiet_config,
    session_key,
    ts,
)

DIMS = 64
SMALL = {"chunk_tokens": 16, "overlap_tokens": 0}
VOCAB = [f"w{i}" for i in range(300)]


def talk(rng: random.Random, n: int) -> list[str]:
    """``n`` messages of five words drawn from VOCAB: distinct texts, few ties in cosine."""
    return [" ".join(rng.sample(VOCAB, 5)) for _ in range(n)]


def cosine(a: bytes, b: bytes) -> float:
    x, y = memoryview(a).cast("b").tolist(), memoryview(b).cast("b").tolist()
    dot = sum(p * q for p, q in zip(x, y, strict=True))
    return dot / (math.sqrt(sum(p * p for p in x)) * math.sqrt(sum(q * q for q in y)))


def scores(memory_backend: MemoryBackend, query: str,
           keep: Any = lambda key, content: True) -> dict[str, float]:
    """Every chunk's exact int8 cosine to ``query`` (what both backends store and rank by),
    by content, among the chunks ``keep(session_key, content)`` accepts."""
    q = quantize_int8(fake_vector(query, DIMS))
    return {content: cosine(quantize_int8(fake_vector(content, DIMS)), q)
            for key, _, _, _, content in memory_backend.chunk_rows() if keep(key, content)}


async def assert_exact_top(svc: BackendMemory, user: str, query: str, k: int,
                           exact: dict[str, float], **filters: Any) -> list[str]:
    """The leg's hits for ``query`` are ``min(k, len(exact))`` chunks, each scoring at least
    the exact k-th best (ties may come in either order), in the order of their scores."""
    response = await svc.search(user, query, k=k, mode="vector", **filters)
    assert response.mode == "vector", response.fallback_reason
    got = [h.content for h in response.results]
    best = sorted(exact.values(), reverse=True)
    assert len(got) == min(k, len(best))
    kth = best[len(got) - 1] if got else 1.0
    assert all(text in exact and exact[text] >= kth - 1e-6 for text in got), (got, best[:k])
    ranked = [exact[t] for t in got]
    # Best first: each score that of the same place in the sorted scores (ties in either order).
    assert all(abs(a - b) < 1e-6 for a, b in zip(ranked, sorted(ranked, reverse=True))), ranked
    return got


async def test_a_small_corpus_gets_the_exact_top_k(memory_backend: MemoryBackend) -> None:
    """With a corpus smaller than every pool and candidate list, the vector leg is exact."""
    rng = random.Random(1)
    for s in range(6):
        memory_backend.write("alice", f"alice{s}", talk(rng, 10), start_minute=s * 100)
    async with memory_backend.opened(quiet_config(**SMALL), FakeEmbedder(dims=DIMS)) as svc:
        for query in ("w1 w2 w3", "w100 w200", "w17 w42 w299 w7"):
            await assert_exact_top(svc, "alice", query, 10, scores(memory_backend, query))


async def test_every_filter_keeps_the_exact_top_k_within_it(memory_backend: MemoryBackend) -> None:
    """sessionKey, excludeSessionKey, a time window and the user: each hit matches the filter,
    and the hits are the exact best of the chunks that match it."""
    rng = random.Random(2)
    for s in range(6):
        memory_backend.write("alice", f"alice{s}", talk(rng, 10), start_minute=s * 100)
    for s in range(2):
        memory_backend.write("bob", f"bob{s}", talk(rng, 10), start_minute=s * 100)
    bobs = {session_key("bob0"), session_key("bob1")}
    query = "w5 w6 w7 w8"
    async with memory_backend.opened(quiet_config(**SMALL), FakeEmbedder(dims=DIMS)) as svc:
        two = session_key("alice2")
        await assert_exact_top(svc, "alice", query, 10,
                               scores(memory_backend, query, lambda key, _: key == two),
                               session_key=two)
        await assert_exact_top(svc, "alice", query, 10,
                               scores(memory_backend, query,
                                      lambda key, _: key != two and key not in bobs),
                               exclude_session_key=two)
        # Sessions alice2 and alice3 only: they start at minutes 200 and 300.
        window = {session_key("alice2"), session_key("alice3")}
        got = await assert_exact_top(svc, "alice", query, 10,
                                     scores(memory_backend, query, lambda key, _: key in window),
                                     after=ts(200), before=ts(310))
        assert got
        hits = (await svc.search("bob", query, k=10, mode="vector")).results
        assert hits and {name_of(h.session_key) for h in hits} <= {"bob0", "bob1"}
        await assert_exact_top(svc, "bob", query, 10,
                               scores(memory_backend, query, lambda key, _: key in bobs))


async def test_a_selective_filter_over_a_large_corpus_keeps_every_match(
        memory_backend: MemoryBackend) -> None:
    """A session filter keeping 8 of ~700 chunks, some of them beyond the first 400 of the corpus
    (PostgreSQL's HNSW candidate list), still returns all 8, best first, whatever plan the
    database picks (at this size PostgreSQL reads the session's rows rather than the HNSW index;
    SQLite's pre-filter cut with a small pool: tests/memory/test_knn.py)."""
    rng = random.Random(3)
    for s in range(70):
        memory_backend.write("alice", f"bulk{s}", talk(rng, 10), start_minute=s)
    memory_backend.write("alice", "needle", talk(rng, 8), start_minute=900)
    needle = session_key("needle")
    async with memory_backend.opened(quiet_config(**SMALL), FakeEmbedder(dims=DIMS)) as svc:
        status = await svc.status()
        assert status["chunks"] >= 700 and status["pending"] == 0
        query = " ".join(VOCAB[:40])
        everything = scores(memory_backend, query)
        inside = scores(memory_backend, query, lambda key, _: key == needle)
        assert len(inside) == 8
        # At least one of them lies beyond the first 400 of the whole corpus: a leg that cut
        # its candidates before filtering would lose it.
        assert min(inside.values()) < sorted(everything.values(), reverse=True)[400]
        await assert_exact_top(svc, "alice", query, 10, inside, session_key=needle)


async def test_writes_are_seen_by_the_next_search(memory_backend: MemoryBackend) -> None:
    """An appended message is the best hit of its own words at the next search after a sync; a
    deleted session's chunks are gone from the next search."""
    rng = random.Random(4)
    for s in range(4):
        memory_backend.write("alice", f"alice{s}", talk(rng, 10), start_minute=s * 100)
    async with memory_backend.opened(quiet_config(**SMALL), FakeEmbedder(dims=DIMS)) as svc:
        before = await svc.search("alice", "zebra quagga okapi", k=5, mode="vector")
        assert before.results and "zebra" not in before.results[0].content
        memory_backend.append("alice", "alice1", ["zebra quagga okapi"], start_minute=150)
        await svc.sync_now()
        after = (await svc.search("alice", "zebra quagga okapi", k=1, mode="vector")).results
        assert "zebra" in after[0].content
        assert await svc.delete_session("alice", session_key("alice1"))
        gone = (await svc.search("alice", "zebra quagga okapi", k=50, mode="vector")).results
        assert gone and all(name_of(h.session_key) != "alice1" for h in gone)
        assert len(gone) == len(scores(memory_backend, "x"))
