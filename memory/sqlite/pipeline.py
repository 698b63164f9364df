"""A search from request to response, and what searches keep between them.

:class:`SearchPipeline` runs a :class:`~memory.retrieval.request.SearchRequest` in three timed
steps: the query vector (:meth:`SearchPipeline.query_vector`: this embedder's, from a small
cache of recent queries; or, while the vectors are rebuilt for a new embedder, the previous
model's, :mod:`memory.sqlite.previous`; or none and why, and the search runs keyword-only);
the fused search on a read connection (:class:`~memory.sqlite.search.HybridSearch`, with
the index's in-memory sign bits and common-word counts); and the cross-encoder re-rank
(:class:`memory.retrieval.rerank_step.RerankStep`, the step PostgreSQL runs too). It also knows
whether the vector leg may run (:meth:`refresh`, after each sync) and what recall's relevance floor
is for the vectors that answered.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import apsw

from memory.config import MemoryConfig
from memory.embedders.embeddings import Embedder, EmbeddingPipeline, RecentQueries
from memory.embedders.previous import (
    NOT_REBUILDING,
    EmbedderIdentity,
    PreviousFactory,
    RebuildState,
    relevance_floor,
    route_query,
    vector_search_status,
)
from memory.errors import EmbedderError
from memory.quantize import vector_to_blob
from memory.retrieval.request import SearchHit, SearchRequest, SearchResponse
from memory.retrieval.rerank_step import RerankStep
from memory.sqlite.index.db import in_thread
from memory.sqlite.interim import PreviousVectors
from memory.sqlite.live import LiveIndex
from memory.sqlite.previous import SqlitePreviousModel
from memory.sqlite.search import HybridSearch

__all__ = ["QueryVector", "SearchPipeline"]

ReadFn = Callable[[Callable[[apsw.Connection], Any]], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class QueryVector:
    """What a search's vector leg runs with: the query vector (None: keyword only), the previous
    identity's vectors when they serve, the mode that runs, and why it differs from the asked
    one."""

    blob: bytes | None
    previous: PreviousVectors | None
    mode: str
    fallback: str | None


class SearchPipeline:
    def __init__(self, config: MemoryConfig, embedder: Embedder | None, embedder_reason: str,
                 db_path: os.PathLike[str], previous_embedder: PreviousFactory | None) -> None:
        self.rerank = RerankStep(config, embedder)
        self._config = config
        self.embedder = embedder
        self.embedder_reason = embedder_reason
        self.embeddings = EmbeddingPipeline.from_config(embedder, config) if embedder else None
        self.identity = EmbedderIdentity.of(embedder) if embedder else None
        self.vector_state: tuple[bool, str] = (False, "not started")
        # After an embedder change: whether this identity's vectors are being (re)built, and
        # the identity whose complete vectors may serve meanwhile (memory.sqlite.interim).
        self.rebuild: RebuildState = NOT_REBUILDING
        self.previous = SqlitePreviousModel(config, db_path, previous_embedder)
        self._recent = RecentQueries(self.embeddings) if self.embeddings else None

    @property
    def config(self) -> MemoryConfig:
        return self._config

    @config.setter
    def config(self, config: MemoryConfig) -> None:
        """The next search reads the new settings, its re-rank step among them."""
        self._config = config
        self.rerank.config = config

    async def refresh(self, index: LiveIndex | None, read: ReadFn) -> None:
        """Recompute whether the vector leg may run, and who serves it during a rebuild."""
        self.vector_state, self.rebuild = await asyncio.to_thread(self._vector_state, index)
        rebuild = self.rebuild
        serve = (rebuild.previous
                 if rebuild.rebuilding and not self.vector_state[0] and self.embeddings else None)
        await self.previous.update_from(serve, read)
        await self.rerank.warm()

    def _vector_state(self, index: LiveIndex | None) -> tuple[tuple[bool, str], RebuildState]:
        if index is None:
            return (False, "not started"), NOT_REBUILDING
        vectors = index.indexer.vectors
        rebuild = vectors.rebuild_state(self.identity)
        if self.identity is None:
            reason = self.embedder_reason
            return (False, f"no embedder ({reason})" if reason else "no embedder"), rebuild
        return vectors.state(self.identity), rebuild

    async def embed_query(self, text: str) -> list[float]:
        """The query vector of ``text``, from a small cache of recent queries when it is there."""
        if self._recent is None:
            raise EmbedderError("no embedder is active", retryable=False)
        return await self._recent.embed(text)

    async def query_vector(self, request: SearchRequest) -> QueryVector:
        # Taken before the query is embedded: a search that outlives the rebuild then loads into
        # this released object, not into a fresh registry entry nobody frees.
        vectors = self.previous.vectors
        routed = await route_query(request.mode, request.query, state=self.vector_state,
                                   rebuilding=self.rebuild.rebuilding,
                                   embed=self.embed_query if self.embeddings else None,
                                   previous=self.previous)
        if routed.vector is None:
            return QueryVector(None, None, routed.mode, routed.fallback)
        if routed.previous is None:
            return QueryVector(vector_to_blob(routed.vector), None, routed.mode, None)
        if vectors is None or vectors.identity != routed.previous:   # released meanwhile
            return QueryVector(None, None, "keyword", self.vector_state[1])
        return QueryVector(vector_to_blob(routed.vector), vectors, routed.mode, routed.fallback)

    async def search(self, request: SearchRequest, index: LiveIndex) -> SearchResponse:
        started = time.perf_counter()
        query = await self.query_vector(request)
        embedded_at = time.perf_counter()
        fetch = self.rerank.fetch(request, query.mode)

        def fused(db: apsw.Connection) -> list[SearchHit]:
            search = HybridSearch(db, self.config, previous=query.previous, signs=index.signs,
                                  common=index.common)
            return search.search(fetch, query_vector=query.blob, keyword=query.mode != "vector")

        hits = await in_thread("searching", index.readers.run, fused)
        done = time.perf_counter()
        timings = {"embedMs": round((embedded_at - started) * 1000, 2),
                   "searchMs": round((done - embedded_at) * 1000, 2)}
        hits, failed = await self.rerank.apply(request, query.mode, hits, timings)
        return SearchResponse(hits, query.mode, query.fallback or failed, timings,
                              previous_model=(query.previous.identity.model if query.previous
                                              else None))

    def relevance_floor(self, response: SearchResponse) -> float | None:
        """Recall's floor on the cosine of what ``response`` found (calibrated per model: a cosine
        means different things to different models)."""
        return relevance_floor(self.config, response.previous_model is not None, self.embedder,
                               self.previous)

    def vector_status(self, embedded: int, total: int) -> dict[str, Any]:
        """``memory.status``'s ``vectorSearch``: whether the leg runs, whose vectors answer it,
        and a rebuild's progress."""
        ready, why = self.vector_state
        return vector_search_status(ready=ready, why=why, identity=self.identity,
                                    rebuild=self.rebuild, previous=self.previous,
                                    embedded=embedded, total=total)
