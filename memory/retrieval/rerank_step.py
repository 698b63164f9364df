"""The re-rank step of a search (``memory.rerank``), the same on every backend.

A search asks its storage for the fused candidates (:meth:`RerankStep.fetch` widens ``k`` to
``rerank_candidates`` while the step is on), then hands them to :meth:`RerankStep.apply`, which
orders them by the cross-encoder (:class:`memory.embedders.rerank.CrossEncoder`) and cuts them to
the ``k`` asked for. Which step runs:

- ``rerank = true``: every candidate is read, whatever it costs;
- ``rerank = "auto"`` with the local embedder (the models ship in the same package): as many as
  fit ``rerank_budget_ms``; skipped when both legs put the same chunk first (the re-ranker is
  unlikely to do better), and while ``rerank_max_concurrent`` searches are already in it (the
  search answers in fused order at once rather than queue for the CPU, ``timings_ms.rerankBusy``);
- otherwise none.

The step never fails a search: a fault in the optional model answers in fused order (named in
``fallbackReason`` when every candidate was to be read). :meth:`RerankStep.warm` loads and times
the model after a sync, so no search pays for it; a fault there turns "auto" off for the run.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Literal

import structlog

from memory.config import MemoryConfig
from memory.embedders.embeddings import Embedder
from memory.embedders.local_embedder import default_threads
from memory.embedders.rerank import CrossEncoder, reranker_installed
from memory.errors import EmbedderError
from memory.retrieval.request import SearchHit, SearchRequest

__all__ = ["RerankStep", "legs_agree"]

log = structlog.get_logger("memory.search")

Step = Literal["all", "budget", "off"]


class RerankStep:
    """One service's re-rank step: its cross-encoder, whether "auto" may use it, and how many
    searches are in it now."""

    def __init__(self, config: MemoryConfig, embedder: Embedder | None) -> None:
        self.config = config   # replaced with the service's when its settings change
        self.local = embedder is not None and embedder.provider == "local"
        self.reranker = CrossEncoder(threads=config.local_threads or default_threads())
        self._installed = reranker_installed()
        self._failed: str | None = None   # why "auto" could not load the model
        self._running = 0   # searches now in the "auto" step (rerank_max_concurrent)

    def step(self) -> Step:
        """``"all"``: re-rank every candidate (``rerank = true``); ``"budget"``: as many as fit
        ``rerank_budget_ms`` (``"auto"``, where the local models run); ``"off"``."""
        setting = self.config.rerank
        if setting is True:
            return "all"
        if setting == "auto" and self.local and self._installed and self._failed is None:
            return "budget"
        return "off"

    def fetch(self, request: SearchRequest, mode: str) -> SearchRequest:
        """What to ask the storage for: ``request``, with ``k`` widened to the candidates the
        step reads when it runs for a search in ``mode`` (a keyword search is never re-ranked)."""
        if mode == "keyword" or self.step() == "off":
            return request
        return replace(request, k=max(request.k, self.config.rerank_candidates))

    async def warm(self) -> None:
        """Load and time the model for "auto" if it is not yet (after a sync: no search waits)."""
        if self.step() != "budget" or self.reranker.ready:
            return
        try:
            await asyncio.to_thread(self.reranker.warm)
        except EmbedderError as exc:
            self._failed = str(exc)
        except Exception as exc:  # a fault in the optional model must not fail the sync
            log.exception("memory.rerank.failed")
            self._failed = f"re-ranker failed: {type(exc).__name__}"

    async def apply(self, request: SearchRequest, mode: str, hits: list[SearchHit],
                    timings: dict[str, float]) -> tuple[list[SearchHit], str | None]:
        """``hits`` (what :meth:`fetch` asked for, fused order) re-ranked by the step and cut to
        ``request.k``, and why the fused order stands when the re-ranker could not run. The
        step's own figures go into ``timings`` (``rerankMs``, ``reranked``, ``rerankBusy``)."""
        step = self.step() if mode != "keyword" else "off"
        started = time.perf_counter()
        fallback = None
        self.reranker.passage_words = self.config.rerank_passage_words
        if step == "all" and hits:
            hits, fallback = await _rerank(self.reranker, request.query, hits)
            timings["rerankMs"] = round((time.perf_counter() - started) * 1000, 2)
        elif step == "budget" and hits and self.reranker.ready and not legs_agree(hits):
            if self._running >= self.config.rerank_max_concurrent:
                timings["rerankBusy"] = float(self._running)   # backed off: fused order
            else:
                self._running += 1
                try:
                    hits, read = await _rerank_within(self.reranker, request.query,
                                                      hits[:self.config.rerank_candidates],
                                                      self.config.rerank_budget_ms, started)
                finally:
                    self._running -= 1
                timings["rerankMs"] = round((time.perf_counter() - started) * 1000, 2)
                timings["reranked"] = float(read)
        return hits[:request.k], fallback


def legs_agree(hits: list[SearchHit]) -> bool:
    """Both legs rank the fused top hit first: the re-ranker is unlikely to do better."""
    return hits[0].keyword_rank == 1 and hits[0].vector_rank == 1


async def _rerank(reranker: CrossEncoder, query: str,
                  hits: list[SearchHit]) -> tuple[list[SearchHit], str | None]:
    """``hits`` in the cross-encoder's order with its scores; the fused order stands, with the
    reason, when the re-ranker cannot run (it never fails a search)."""
    try:
        scores = await reranker.score(query, [h.content for h in hits])
    except EmbedderError as exc:
        return hits, f"re-ranker unavailable: {exc}"
    except Exception as exc:  # a fault in the optional step answers with the fused order, logged
        log.exception("memory.rerank.failed")
        return hits, f"re-ranker failed: {type(exc).__name__}"
    order = sorted(range(len(hits)), key=lambda i: -scores[i])
    return [replace(hits[i], score=scores[i]) for i in order], None


async def _rerank_within(reranker: CrossEncoder, query: str, hits: list[SearchHit],
                         budget_ms: float, started: float) -> tuple[list[SearchHit], int]:
    """The first hits the budget let the cross-encoder read, in its order with its scores, then
    the others in fused order; and how many it read. A failure leaves the fused order."""
    try:
        scored = await reranker.score_within(query, [h.content for h in hits], budget_ms, started)
    except EmbedderError:
        return hits, 0
    except Exception:  # as in _rerank: the search still answers, in fused order
        log.exception("memory.rerank.failed")
        return hits, 0
    read = len(scored.scores)
    order = sorted(range(read), key=lambda i: -scored.scores[i])
    return [replace(hits[i], score=scored.scores[i]) for i in order] + hits[read:], read
