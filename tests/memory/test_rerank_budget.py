"""The cross-encoder within a time budget (``rerank = "auto"``): what it reads, when it is
skipped, and that ``rerank = false`` keeps the fused order. No assertion here is on time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import pytest

from memory.config import MemoryConfig
from memory.embedders.rerank import (
    FLOOR,
    MARGIN,
    MIN_WINDOW_WORDS,
    CrossEncoder,
    best_window,
    next_batch,
    plan_batch,
    reranker_installed,
    window_words,
)
from memory.pg.service import PgMemory
from memory.retrieval.request import SearchHit
from memory.retrieval.rerank_step import RerankStep, legs_agree
from tests.memory.conftest import (
    BackendMemory,
    FakeEmbedder,
    MemoryBackend,
    quiet_config,
    ts,
)


class LocalFakeEmbedder(FakeEmbedder):
    """The counting fake, standing where the local model stands: "auto" re-ranks only there."""

    provider = "local"


def test_plan_batch_takes_the_pairs_the_measured_cost_fits() -> None:
    """A batch holds the most pairs whose padded size, at the measured cost and margin, fits."""
    assert plan_batch([10, 10, 10, 10], 1.0, 25.0) == 2    # 2 × 10 × 1.25 = 25
    assert plan_batch([10, 40], 1.0, 60.0) == 1            # padding to 40 would cost 100
    assert plan_batch([30], 1.0, 10.0) == 0
    assert plan_batch([10] * 30, 0.01, 1000.0) == 30       # a faster machine reads them all


def test_the_cost_estimate_is_a_low_quantile_so_one_slow_batch_does_not_stop_the_step() -> None:
    """A batch slowed by a neighbour's burst does not set the cost the next searches plan at,
    and a burst ages out of the history."""
    encoder = CrossEncoder()
    assert encoder.ms_per_token is None and not encoder.ready
    for cost in (0.2, 0.2, 5.0, 0.2):
        encoder.measured(cost)
    assert encoder.ms_per_token == 0.2
    for _ in range(20):
        encoder.measured(0.1)
    assert encoder.ms_per_token == 0.1


def test_the_first_batch_fills_the_budget_only_where_it_fits_at_the_typical_cost() -> None:
    """Beyond half the time left, the first batch is planned at the median of recent costs, not
    the low quantile: three 70-token pairs fit 120 ms at 0.3 ms a token but not at the 0.5 the
    batches typically cost (planned at 0.3 the step ran to twice its budget at p99)."""
    pairs = [70] * 5
    take = next_batch(pairs, 0.3, 0.5, 120.0, first=True)
    assert take == 2 and take * 70 * 0.5 * MARGIN <= 120.0
    # A steady machine (estimate and typical cost alike) keeps the floor, and more when they fit.
    assert next_batch([70] * 5, 0.3, 0.3, 120.0, first=True) == FLOOR
    assert next_batch([30] * 5, 0.3, 0.3, 120.0, first=True) == 5
    # Fewer than two fitting at the estimate and the typical cost: the step does not start.
    assert next_batch(pairs, 0.8, 0.8, 120.0, first=True) == 0
    # A later batch takes what fits half the time left, one pair when only one fits.
    assert next_batch(pairs, 0.3, 0.5, 60.0, first=False) == 1
    assert next_batch(pairs, 0.3, 0.5, 20.0, first=False) == 0


def test_the_typical_cost_is_the_median_of_the_recent_measurements() -> None:
    """The cost a first batch fills the budget at is the median: above the estimate's quantile,
    and still not set by one burst."""
    encoder = CrossEncoder()
    assert encoder.typical_ms_per_token is None
    for cost in (0.3, 0.5, 0.5, 0.6, 5.0):
        encoder.measured(cost)
    assert encoder.ms_per_token == 0.5 and encoder.typical_ms_per_token == 0.5
    encoder.measured(0.3)
    assert encoder.ms_per_token == 0.3 and encoder.typical_ms_per_token == 0.5


def test_window_words_narrows_passages_so_enough_pairs_fit_the_budget() -> None:
    """Within a budget the passage window shrinks so that several pairs fit, never below the
    minimum; a fast machine keeps the configured window."""
    assert window_words(120, 0.001, 12, 96) == 96
    roomy, tight = window_words(120, 0.1, 12, 96), window_words(120, 0.2, 12, 96)
    assert MIN_WINDOW_WORDS <= tight < roomy < 96
    assert window_words(120, 5.0, 12, 96) == MIN_WINDOW_WORDS
    assert window_words(120, 5.0, 12, 16) == 16


def test_best_window_keeps_the_words_around_the_query_words_not_the_head() -> None:
    """A long passage is cut to the window with the most query words, marked where it was cut."""
    words = [f"filler{i}" for i in range(300)]
    words[200:203] = ["passport", "expires", "March"]
    cut = best_window(" ".join(words), "when does my passport expire in March", 20)
    assert "passport expires March" in cut and cut.startswith("… ") and cut.endswith(" …")
    assert len(cut.split()) == 22
    assert best_window("short text", "passport", 20) == "short text"


def test_legs_agree_only_when_both_legs_rank_the_top_hit_first() -> None:
    """The step is skipped only when the fused top hit is first in the keyword and the
    vector leg."""
    def top(kw: int | None, vec: int | None) -> list[SearchHit]:
        return [SearchHit(1, "s", "x", 1.0, 2, 2, None, None, kw, vec, 0.9)]

    assert legs_agree(top(1, 1))
    assert not legs_agree(top(1, 2)) and not legs_agree(top(None, 1))


def test_the_default_is_auto_within_120_ms() -> None:
    """A new user gets the budgeted re-ranker; a setting other than true, false or "auto"
    is refused."""
    config = MemoryConfig()
    assert (config.rerank, config.rerank_budget_ms) == ("auto", 120)
    with pytest.raises(ValueError, match="rerank must be"):
        MemoryConfig(rerank="sometimes")  # type: ignore[arg-type]


TEXTS = {"a": "The weather in Lisbon was sunny and warm all week.",
         "b": "My passport number expires in March, I must renew it.",
         "c": "We talked about the weather and about nothing much."}
PARAPHRASE = "until when is my travel document valid"   # no word in common with any text
AGREED = "sunny weather in Lisbon"


def _index(memory_backend: MemoryBackend, embedder: FakeEmbedder) -> None:
    axis: Callable[[int], list[float]] = lambda i: [1.0 if j == i else 0.0  # noqa: E731
                                                    for j in range(embedder.dims)]
    # nearest a, then c, then b
    embedder.vectors = {PARAPHRASE: [0.9, 0.1, 0.4] + [0.0] * (embedder.dims - 3),
                        AGREED: axis(0)}
    for i, (name, text) in enumerate(TEXTS.items()):
        memory_backend.write("alice", name, [text])
        embedder.vectors[f"user [{ts(0)}]: {text}"] = axis(i if name != "c" else 2)


def rerank_step(svc: BackendMemory) -> RerankStep:
    """The service's re-rank step (one class on both backends; SQLite's sits in its pipeline)."""
    return svc.rerank if isinstance(svc, PgMemory) else svc._search.rerank


needs_model = pytest.mark.skipif(not reranker_installed(),
                                 reason="the 'local' extra is not installed")


@needs_model
async def test_auto_reads_the_candidates_the_budget_fits_and_keeps_the_rest_in_fused_order(
        memory_backend: MemoryBackend) -> None:
    """A budget that fits every candidate lets the cross-encoder read them all and put the answer
    first; one that fits none leaves the fused order, with zero candidates read."""
    embedder = LocalFakeEmbedder()
    _index(memory_backend, embedder)
    async with memory_backend.opened(quiet_config(rerank_candidates=3, rerank_budget_ms=600_000),
                                     embedder) as svc:
        roomy = await svc.search("alice", PARAPHRASE, k=3)
    async with memory_backend.opened(quiet_config(rerank_candidates=3, rerank_budget_ms=1),
                                     embedder) as svc:
        tight = await svc.search("alice", PARAPHRASE, k=3)
    async with memory_backend.opened(quiet_config(rerank=False), embedder) as svc:
        fused = await svc.search("alice", PARAPHRASE, k=3)
    assert roomy.timings_ms["reranked"] == 3 and "passport" in roomy.results[0].content
    assert tight.timings_ms["reranked"] == 0
    assert [h.chunk_id for h in tight.results] == [h.chunk_id for h in fused.results]
    assert "Lisbon" in fused.results[0].content


@needs_model
async def test_auto_skips_the_step_when_both_legs_put_the_same_chunk_first(
        memory_backend: MemoryBackend) -> None:
    """When the keyword and vector legs agree on the top hit, no candidate is re-ranked."""
    embedder = LocalFakeEmbedder()
    _index(memory_backend, embedder)
    async with memory_backend.opened(quiet_config(rerank_budget_ms=600_000), embedder) as svc:
        agreed = await svc.search("alice", AGREED, k=3)
        disputed = await svc.search("alice", PARAPHRASE, k=3)
    assert "Lisbon" in agreed.results[0].content and "rerankMs" not in agreed.timings_ms
    assert "rerankMs" in disputed.timings_ms


@needs_model
async def test_rerank_false_and_a_remote_embedder_keep_the_fused_path(
        memory_backend: MemoryBackend) -> None:
    """``rerank = false`` (and "auto" where the embedder is not the local one) is the fused
    order, no re-rank step; the same index re-ranks under "auto" with the local embedder."""
    local = LocalFakeEmbedder()
    _index(memory_backend, local)
    async with memory_backend.opened(quiet_config(rerank=False), local) as svc:
        off = await svc.search("alice", PARAPHRASE, k=3)
    remote = FakeEmbedder()
    _index(memory_backend, remote)
    async with memory_backend.opened(quiet_config(), remote) as svc:
        not_local = await svc.search("alice", PARAPHRASE, k=3)
    for response in (off, not_local):
        assert "rerankMs" not in response.timings_ms and "Lisbon" in response.results[0].content


class _Watched(CrossEncoder):
    """The real cross-encoder, noting each run's own cost and what it records."""

    def __init__(self) -> None:
        super().__init__()
        self.raw: list[float] = []
        self.recorded: list[float] = []

    def _infer(self, encodings: Sequence[Any]) -> tuple[list[float], float]:
        scores, cost = super()._infer(encodings)
        self.raw.append(cost)
        return scores, cost

    def measured(self, cost: float) -> None:
        self.recorded.append(cost)
        super().measured(cost)


@needs_model
def test_a_probe_records_what_a_batch_would_cost_not_its_own_cost() -> None:
    """warm() measures how much dearer a token of a lone short probe pair is than a token of a
    batch; a probe run when nothing fits records its cost scaled by that ratio (recorded as it
    was, the probe kept the estimate above the machine's real cost once a burst had passed)."""
    encoder = _Watched()
    encoder.warm()
    assert 0.0 < encoder.probe_scale <= 1.0
    encoder.probe_scale = 0.5
    for _ in range(12):
        encoder.measured(1000.0)  # learnt in a burst: nothing fits any budget
    encoder._measured_at = time.monotonic() - 60  # old enough to be measured again
    encoder.raw.clear()
    encoder.recorded.clear()
    scored = encoder._score_within("when is my passport valid",
                                   ["my passport expires in March " * 10], time.perf_counter() + 10)
    assert scored.scores == [] and len(encoder.raw) == 1
    assert encoder.recorded == [pytest.approx(encoder.raw[0] * 0.5)]


@needs_model
@pytest.mark.parametrize("rerank", ["auto", True])
async def test_a_query_longer_than_the_models_input_is_cut_not_failed(memory_backend: MemoryBackend,
                                                                      rerank: Any) -> None:
    """A search whose query runs past the cross-encoder's 256-token input (a pasted page as a chat
    message) is re-ranked on the query's first QUERY_TOKENS tokens; it used to fail the whole
    search with the tokenizer's "Truncation error: Second sequence not provided"."""
    long_query = PARAPHRASE + " " + " ".join(f"filler{i}" for i in range(400))
    embedder = LocalFakeEmbedder()
    _index(memory_backend, embedder)
    embedder.vectors[long_query] = embedder.vectors[PARAPHRASE]
    async with memory_backend.opened(quiet_config(rerank=rerank, rerank_budget_ms=600_000),
                                     embedder) as svc:
        response = await svc.search("alice", long_query, k=3)
    assert "rerankMs" in response.timings_ms and len(response.results) == 3
    assert response.fallback_reason is None
    if rerank == "auto":  # the step read candidates (a swallowed fault would read none)
        assert response.timings_ms["reranked"] > 0


class _Broken(CrossEncoder):
    """The cross-encoder with a fault in its model run (not an EmbedderError)."""

    def _score(self, query: str, passages: Sequence[str]) -> list[float]:
        raise RuntimeError("model fault")


@needs_model
async def test_a_fault_in_the_re_ranker_answers_in_fused_order(
        memory_backend: MemoryBackend) -> None:
    """An unexpected error inside the re-rank step does not fail the search: it answers in the
    fused order, naming the fault in fallbackReason."""
    embedder = LocalFakeEmbedder()
    _index(memory_backend, embedder)
    async with memory_backend.opened(quiet_config(rerank=False), embedder) as svc:
        fused = await svc.search("alice", PARAPHRASE, k=3)
    async with memory_backend.opened(quiet_config(rerank=True), embedder) as svc:
        rerank_step(svc).reranker = _Broken()
        broken = await svc.search("alice", PARAPHRASE, k=3)
    assert [h.chunk_id for h in broken.results] == [h.chunk_id for h in fused.results]
    assert broken.fallback_reason == "re-ranker failed: RuntimeError"


@needs_model
async def test_a_fault_while_loading_the_re_ranker_leaves_auto_off_and_the_daemon_up(
        memory_backend: MemoryBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fault other than an EmbedderError in warm() (which loads and times the model after a
    sync) turns the "auto" step off for this run; it used to fail the start of the service."""
    def broken_warm(self: CrossEncoder) -> None:
        raise RuntimeError("model fault")

    monkeypatch.setattr(CrossEncoder, "warm", broken_warm)
    embedder = LocalFakeEmbedder()
    _index(memory_backend, embedder)
    async with memory_backend.opened(quiet_config(rerank="auto", rerank_budget_ms=600_000),
                                     embedder) as svc:
        response = await svc.search("alice", PARAPHRASE, k=3)
        status = await svc.status()
    assert len(response.results) == 3 and "rerankMs" not in response.timings_ms
    assert status["lastError"] is None


class _Held:
    """The real cross-encoder whose first budgeted step waits for ``release`` once inside: a
    search held in the re-rank step for as long as the test needs."""

    def __init__(self, encoder: CrossEncoder) -> None:
        self.encoder = encoder
        self.inside = asyncio.Event()
        self.release = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.encoder, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("encoder", "inside", "release"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.encoder, name, value)

    async def score_within(self, *args: Any, **kwargs: Any) -> Any:
        if not self.inside.is_set():
            self.inside.set()
            await self.release.wait()
        return await self.encoder.score_within(*args, **kwargs)


@needs_model
@pytest.mark.parametrize("most", [1, 2])
async def test_auto_backs_off_while_rerank_max_concurrent_searches_are_in_the_step(
        memory_backend: MemoryBackend, most: int) -> None:
    """With ``rerank_max_concurrent`` searches re-ranking, another search answers at once in
    fused order (``rerankBusy``); below the limit, and once the step is free, it re-ranks."""
    embedder = LocalFakeEmbedder()
    _index(memory_backend, embedder)
    async with memory_backend.opened(quiet_config(rerank=False), embedder) as svc:
        fused = await svc.search("alice", PARAPHRASE, k=3)
    config = quiet_config(rerank_budget_ms=600_000, rerank_max_concurrent=most)
    async with memory_backend.opened(config, embedder) as svc:
        await svc.search("alice", PARAPHRASE, k=3)   # loads and calibrates the model
        step = rerank_step(svc)
        held = _Held(step.reranker)
        step.reranker = cast(CrossEncoder, held)   # the real one, held open
        first = asyncio.create_task(svc.search("alice", PARAPHRASE, k=3))
        await asyncio.wait_for(held.inside.wait(), 30)
        meanwhile = await svc.search("alice", PARAPHRASE, k=3)
        held.release.set()
        first_done = await first
        after = await svc.search("alice", PARAPHRASE, k=3)
    assert first_done.timings_ms["reranked"] == 3
    if most == 1:
        assert meanwhile.timings_ms["rerankBusy"] == 1 and "rerankMs" not in meanwhile.timings_ms
        assert [h.chunk_id for h in meanwhile.results] == [h.chunk_id for h in fused.results]
    else:
        assert "rerankBusy" not in meanwhile.timings_ms and meanwhile.timings_ms["reranked"] == 3
    assert "rerankBusy" not in after.timings_ms and after.timings_ms["reranked"] == 3


def test_rerank_max_concurrent_below_one_is_refused() -> None:
    """The back-off's limit must let one search re-rank."""
    assert MemoryConfig().rerank_max_concurrent == 1
    with pytest.raises(ValueError, match="rerank_max_concurrent must be at least 1"):
        MemoryConfig(rerank_max_concurrent=0)
