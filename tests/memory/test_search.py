"""Search: ranking, fusion, scoping, safe keyword queries, CJK, filters, validation, the
seed flow."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from gateway.wire import search_wire
from memory.errors import InvalidSearch
from memory.retrieval.request import fts_query
from tests.memory.conftest import (
    BASE_TIME,
    BackendMemory,
    FakeEmbedder,
    MemoryBackend,
    name_of,
    quiet_config,
    session_key,
    ts,
)

INJECTIONS = ['"', '""', "*", "rust*", "NEAR(", "NEAR(rust language, 2)", "AND OR NOT", "col:",
              "body:rust", "(((", ")", "rust)", "^rust", "-rust", "+", "'; DROP TABLE chunks; --",
              '"rust" OR "x', "\\", "{body}"]


async def test_seed_flow_fact_found_after_restart(memory_backend: MemoryBackend) -> None:
    """A fact said in one session is the first hit for a paraphrased question after a restart."""
    memory_backend.write("alice", "s1", [
        "What's the weather like in Lisbon?", "Sunny and mild today.",
        "By the way, my favourite programming language is Rust.", "Noted: you like Rust.",
    ])
    memory_backend.write("alice", "s2", ["Recipe for pancakes please", "Flour, eggs, milk."])
    memory_backend.write("alice", "s3", ["How tall is Mount Everest?", "About 8849 metres."])
    async with memory_backend.opened(quiet_config(chunk_tokens=32, overlap_tokens=8),
                                     FakeEmbedder()):
        pass
    embedder = FakeEmbedder()
    async with memory_backend.opened(quiet_config(chunk_tokens=32, overlap_tokens=8),
                                     embedder) as svc:
        response = await svc.search("alice", "favourite programming language")
    assert response.mode == "hybrid"
    top = response.results[0]
    assert (name_of(top.session_key) == "s1"
            and "favourite programming language is Rust" in top.content)
    assert top.keyword_rank == 1 and top.vector_rank == 1
    assert embedder.calls == [["favourite programming language"]]  # the query only


async def test_user_scoping(memory_backend: MemoryBackend, memory_service: BackendMemory) -> None:
    """A user never gets another user's chunks, in any mode."""
    memory_backend.write("alice", "a1", ["the secret word is pelican"])
    memory_backend.write("bob", "b1", ["the secret word is pelican"])
    await memory_service.sync_now()
    for mode in ("hybrid", "keyword", "vector"):
        hits = (await memory_service.search("alice", "secret word pelican", mode=mode)).results
        assert [name_of(h.session_key) for h in hits] == ["a1"]
    assert (await memory_service.search("carol", "pelican")).results == []


@pytest.mark.parametrize("query", INJECTIONS)
async def test_fts_syntax_is_never_interpreted(memory_backend: MemoryBackend,
                                               memory_service: BackendMemory, query: str) -> None:
    """FTS5 operators and quotes in a query neither raise nor act as syntax."""
    memory_backend.write("alice", "s1",
                         ["rustacean crabs", "and or not are words here", "near the body"])
    await memory_service.sync_now()
    response = await memory_service.search("alice", query, mode="keyword")
    assert response.mode == "keyword"
    if query == "rust*":
        assert response.results == []  # no prefix query: "rust" is not "rustacean"


def test_fts_query_quotes_every_term() -> None:
    """The MATCH expression is quoted terms joined by OR, CJK as bigram phrases."""
    assert fts_query('NEAR("x" b) AND c*') == '"NEAR" OR "x" OR "b" OR "c"'
    assert fts_query('AND "OR" NOT') == '"AND" OR "OR" OR "NOT"'
    assert fts_query("東京タワー") == '"東 京" OR "京 タ" OR "タ ワ" OR "ワ ー"'
    assert fts_query("()*:^") is None


def test_fts_query_leaves_out_function_words_unless_alone() -> None:
    """Function words would make the keyword leg score every chunk; a query of only them
    keeps them."""
    assert (fts_query("what did we say about the Rust borrow checker")
            == '"say" OR "Rust" OR "borrow" OR "checker"')
    assert fts_query("what is it") == '"what" OR "is" OR "it"'


async def test_operator_words_match_as_words(memory_backend: MemoryBackend,
                                             memory_service: BackendMemory) -> None:
    """'AND OR NOT' is searched as three ordinary words."""
    memory_backend.write("alice", "s1", ["apples only"])
    memory_backend.write("alice", "s2", ["and or not are words here"])
    await memory_service.sync_now()
    hits = (await memory_service.search("alice", "AND OR NOT", mode="keyword")).results
    assert [name_of(h.session_key) for h in hits] == ["s2"]


async def test_cjk_query_finds_cjk_text(memory_backend: MemoryBackend,
                                        memory_service: BackendMemory) -> None:
    """A CJK word inside unspaced CJK text is found; an absent one is not."""
    memory_backend.write("alice", "s1", ["我昨天在餐厅吃了寿司，很好吃"])
    memory_backend.write("alice", "s2", ["東京タワーに行きました"])
    await memory_service.sync_now()
    assert [name_of(h.session_key) for h in
            (await memory_service.search("alice", "寿司", mode="keyword")).results] == ["s1"]
    assert [name_of(h.session_key) for h in
            (await memory_service.search("alice", "東京", mode="keyword")).results] == ["s2"]
    assert (await memory_service.search("alice", "北京", mode="keyword")).results == []


def _hand_built(memory_backend: MemoryBackend, embedder: FakeEmbedder) -> None:
    """Three chunks whose keyword and vector ranks disagree (see the comments)."""
    docs = {"a": "apple banana", "b": "apple cherry", "c": "durian"}
    one_hot: Callable[[int], list[float]] = lambda i: [1.0 if j == i else 0.0  # noqa: E731
                                                       for j in range(embedder.dims)]
    near: Callable[[float], list[float]] = lambda w: (  # noqa: E731
        [w, (1 - w * w) ** 0.5] + [0.0] * (embedder.dims - 2))
    embedder.vectors = {
        "apple banana": one_hot(0),
        f"user [{ts(0)}]: apple banana": near(0.1),   # vector rank 3, keyword rank 1
        f"user [{ts(0)}]: apple cherry": near(0.9),   # vector rank 2, keyword rank 2
        f"user [{ts(0)}]: durian": near(0.99),        # vector rank 1, no keyword match
    }
    for key, text in docs.items():
        memory_backend.write("alice", key, [text])


async def test_rrf_order_on_hand_built_case(memory_backend: MemoryBackend,
                                            embedder: FakeEmbedder) -> None:
    """With fusion = "rrf", scores are Σ w/(60 + rank) over both legs and results come in
    that order."""
    _hand_built(memory_backend, embedder)
    async with memory_backend.opened(quiet_config(fusion="rrf", keyword_weight=0.5,
                                                  recency_weight=0.0), embedder) as svc:
        hits = (await svc.search("alice", "apple banana")).results
    got = [(name_of(h.session_key), h.keyword_rank, h.vector_rank) for h in hits]
    assert got == [("a", 1, 3), ("b", 2, 2), ("c", None, 1)]
    expected = [0.5 / 61 + 0.5 / 63, 1 / 62, 0.5 / 61]
    assert [h.score for h in hits] == pytest.approx(expected)


async def test_convex_fusion_on_hand_built_case(memory_backend: MemoryBackend,
                                                embedder: FakeEmbedder) -> None:
    """The default fusion adds min-max normalised leg scores, weighted keyword_weight : 1 -
    keyword_weight."""
    _hand_built(memory_backend, embedder)
    async with memory_backend.opened(quiet_config(keyword_weight=0.4, recency_weight=0.0),
                                     embedder) as svc:
        hits = (await svc.search("alice", "apple banana")).results
    got = [(name_of(h.session_key), h.keyword_rank, h.vector_rank) for h in hits]
    # cosine to the query: a 0.1, b 0.9, c 0.99 → normalised 0, 0.89, 1; BM25: a best (1),
    # b worst (0).
    assert got == [("c", None, 1), ("b", 2, 2), ("a", 1, 3)]
    assert hits[0].score == pytest.approx(0.6, abs=0.01)
    assert hits[1].score == pytest.approx(0.6 * (0.9 - 0.1) / (0.99 - 0.1), abs=0.02)
    assert hits[2].score == pytest.approx(0.4, abs=0.01)


async def test_keyword_only_hit_is_kept_in_hybrid(memory_backend: MemoryBackend,
                                                  embedder: FakeEmbedder) -> None:
    """A chunk only the keyword leg found stays in hybrid results with its keyword rank (RRF:
    ranked by it)."""
    embedder.vectors = {"zymurgy": [1.0] + [0.0] * (embedder.dims - 1)}
    for i in range(4):
        memory_backend.write("alice", f"s{i}", [f"filler text {i}"])
    memory_backend.write("alice", "target", ["a note on zymurgy"])
    for i in range(4):
        embedder.vectors[f"user [{ts(0)}]: filler text {i}"] = ([1.0 - i * 0.01]
                                                                + [0.1] * (embedder.dims - 1))
    config = quiet_config(candidates=2, max_k=2, default_k=2, fusion="rrf", keyword_weight=0.5)
    async with memory_backend.opened(config, embedder) as svc:
        hits = (await svc.search("alice", "zymurgy", k=2)).results
    target = [h for h in hits if name_of(h.session_key) == "target"]
    assert target and target[0].keyword_rank == 1 and target[0].vector_rank is None


def test_convex_fusion_keeps_every_hit_of_either_leg() -> None:
    """Convex fusion returns every chunk either leg found, with the ranks each leg gave it."""
    from memory.retrieval.fusion import fuse

    keyword = [(7, 9.0), (3, 4.0)]            # chunk 7 only the keyword leg found
    vector = [(3, 0.8), (5, 0.7), (9, 0.2)]   # chunks 5 and 9 only the vector leg found
    fused = {f.chunk_id: f for f in fuse(keyword, vector, quiet_config(keyword_weight=0.4))}
    assert set(fused) == {3, 5, 7, 9}
    assert (fused[7].keyword_rank, fused[7].vector_rank) == (1, None)
    assert (fused[9].keyword_rank, fused[9].vector_rank) == (None, 3)
    assert fused[7].score == pytest.approx(0.4) and fused[3].score == pytest.approx(0.6)


async def test_filters_session_exclude_and_time(memory_backend: MemoryBackend,
                                                memory_service: BackendMemory) -> None:
    """sessionKey, excludeSessionKey, after and before narrow both legs alike."""
    for i, key in enumerate(["s1", "s2", "s3"]):
        memory_backend.write("alice", key, [f"marmot sighting {key}"], start_minute=i * 100)
    await memory_service.sync_now()
    for mode in ("hybrid", "keyword", "vector"):
        async def keys(**kw: Any) -> list[str]:
            return sorted(name_of(h.session_key) for h in
                          (await memory_service.search("alice", "marmot", mode=mode, **kw)).results)  # noqa: B023
        assert await keys(session_key=session_key("s2")) == ["s2"]
        assert await keys(exclude_session_key=session_key("s2")) == ["s1", "s3"]
        assert await keys(after=ts(150)) == ["s3"]
        assert await keys(before=ts(50)) == ["s1"]
        assert await keys(after=ts(50), before=ts(150)) == ["s2"]
        assert await keys(after="2026-11-22") == ["s1", "s2", "s3"]


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"k": 0}, "k"), ({"k": 51}, "k"), ({"k": "3"}, "k"), ({"k": True}, "k"),
    ({"mode": "fuzzy"}, "mode"), ({"after": "yesterday"}, "after"), ({"before": 5}, "before"),
    ({"after": "2026-11-23", "before": "2026-11-22"}, "before"),
    ({"session_key": ""}, "sessionKey"),
])
async def test_invalid_params_name_the_field(memory_service: BackendMemory,
                                             kwargs: dict[str, object], field: str) -> None:
    """Bad parameters raise InvalidSearch with the wire field name."""
    with pytest.raises(InvalidSearch) as info:
        await memory_service.search("alice", "x", **kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


async def test_empty_query_is_invalid(memory_service: BackendMemory) -> None:
    """An empty or blank query is rejected as invalid 'query'."""
    with pytest.raises(InvalidSearch) as info:
        await memory_service.search("alice", "   ")
    assert info.value.field == "query"


async def test_no_embedder_falls_back_to_keyword(memory_backend: MemoryBackend) -> None:
    """With no embedder, hybrid runs keyword-only and says why in the wire result."""
    memory_backend.write("alice", "s1", ["quokka smiles"])
    async with memory_backend.opened(quiet_config(), None,
                                     embedder_reason="embedder 'none' configured") as svc:
        wire = search_wire(await svc.search("alice", "quokka"))
        status = await svc.status()
    assert wire["mode"] == "keyword" and "none" in wire["fallbackReason"]
    assert wire["results"][0]["keywordRank"] == 1 and "vectorRank" not in wire["results"][0]
    assert set(wire["results"][0]) >= {"chunkId", "sessionKey", "content", "score", "lineStart",
                                       "lineEnd", "startTs", "endTs"}
    assert status["provider"] == "none" and status["pending"] == 1


async def test_time_phrase_puts_its_window_first(memory_backend: MemoryBackend,
                                                 memory_service: BackendMemory) -> None:
    """"… last week" ranks what was said last week (relative to ``now``) above a better match
    from earlier."""
    day = 24 * 60
    memory_backend.write("alice", "old", ["heron heron heron by the river"], start_minute=0)
    memory_backend.write("alice", "recent", ["a heron again"], start_minute=20 * day)
    await memory_service.sync_now()
    now = BASE_TIME + timedelta(days=24)   # "last week" is then days 14–21 after BASE_TIME
    plain = (await memory_service.search("alice", "heron", mode="keyword", now=now)).results
    assert [name_of(h.session_key) for h in plain] == ["old", "recent"]
    timed = (await memory_service.search("alice", "the heron last week", mode="keyword",
                                         now=now)).results
    assert [name_of(h.session_key) for h in timed] == ["recent", "old"]


async def test_time_phrases_can_be_switched_off(memory_backend: MemoryBackend,
                                                embedder: FakeEmbedder) -> None:
    """With time_phrases = false a time phrase is only words: ranking ignores its window."""
    day = 24 * 60
    memory_backend.write("alice", "old", ["heron heron heron by the river"], start_minute=0)
    memory_backend.write("alice", "recent", ["a heron again"], start_minute=20 * day)
    async with memory_backend.opened(quiet_config(time_phrases=False), embedder) as svc:
        hits = (await svc.search("alice", "the heron last week", mode="keyword",
                                 now=BASE_TIME + timedelta(days=24))).results
    assert [name_of(h.session_key) for h in hits] == ["old", "recent"]


async def test_recency_breaks_a_tie_towards_what_was_said_lately(memory_backend: MemoryBackend,
                                                                 embedder: FakeEmbedder) -> None:
    """Two chunks equal to both legs: a hybrid search with recency (recall's) puts the one said
    lately first; a plain search, keyword mode and recency_weight = 0 leave the tie."""
    day = 24 * 60
    memory_backend.write("alice", "old", ["the quokka ate grass"], start_minute=0)
    memory_backend.write("alice", "new", ["the quokka ate grass"], start_minute=398 * day)
    now = BASE_TIME + timedelta(days=400)
    for weight in (0.2, 0.0):
        async with memory_backend.opened(quiet_config(recency_weight=weight), embedder) as svc:
            hybrid = (await svc.search("alice", "quokka", mode="hybrid", now=now,
                                       recency=True)).results
            keyword = (await svc.search("alice", "quokka", mode="keyword", now=now,
                                        recency=True)).results
            plain = (await svc.search("alice", "quokka", mode="hybrid", now=now)).results
        assert keyword[0].score == keyword[1].score  # no recency term outside hybrid
        assert plain[0].score == plain[1].score  # memory.search ranks by relevance alone
        if weight:
            assert [name_of(h.session_key) for h in hybrid] == ["new", "old"]
            expected = weight * (0.5 ** (2 / 60) - 0.5 ** (400 / 60))
            assert hybrid[0].score - hybrid[1].score == pytest.approx(expected, abs=1e-3)
        else:
            assert hybrid[0].score == hybrid[1].score


async def test_a_word_in_most_chunks_is_left_out_while_a_rarer_one_remains(
        memory_backend: MemoryBackend) -> None:
    """Past keyword_common_share of the chunks (and keyword_common_min_chunks), a query word is
    left out of the keyword leg when the query has a rarer word, and kept when it is alone."""
    for i in range(9):
        memory_backend.write("alice", f"b{i}", [f"banana bread attempt {i}"])
    memory_backend.write("alice", "p", ["a pelican ate the banana"])
    memory_backend.write("alice", "q", ["pelican sighting at the harbour"])
    common = quiet_config(keyword_common_share=0.5, keyword_common_min_chunks=2)
    async with memory_backend.opened(common, None) as svc:
        pruned = (await svc.search("alice", "banana pelican", mode="keyword", k=20)).results
        alone = (await svc.search("alice", "banana", mode="keyword", k=20)).results
    assert sorted(name_of(h.session_key) for h in pruned) == ["p", "q"]
    assert len(alone) == 10
    async with memory_backend.opened(quiet_config(), None) as svc:  # 11 chunks: far below
                                                                    # the default floor
        every = (await svc.search("alice", "banana pelican", mode="keyword", k=20)).results
    assert len(every) == 11 and name_of(every[0].session_key) == "p"
