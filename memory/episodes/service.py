"""``Episodes``: episodic memory's rules on either backend, each store step run through
:class:`~memory.steps.Steps` on the backend's episode store (``memory.sqlite.episodes``,
``memory.pg.episodes``).

Search over episodes is a small hybrid in Python, like facts (a user has at most a dozen a day):
``w · keyword + (1 − w) · cosine``, then mixed with recency, ``(1 − r) · relevance + r · 0.5^(age
/ half-life)``, so a question about "what we talked about" prefers recent conversations when
relevance is close. A time window (from a time phrase) keeps only episodes whose conversation
reached into it. :class:`ScoredEpisode` lives in :mod:`memory.episodes.values`; it is
re-exported here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from memory.chunking import content_terms
from memory.embedders.embeddings import EmbeddingPipeline
from memory.episodes.values import Episode, EpisodeDraft, EpisodeJob, ScoredEpisode
from memory.errors import EmbedderError
from memory.facts.rules import cosine
from memory.steps import Steps

__all__ = ["Episodes", "ScoredEpisode"]

log = structlog.get_logger("memory.episodes")

_DAY_MS = 86_400_000
_CANDIDATES = 500  # newest episodes scored per search: months of them at the daily cap


class Episodes:
    # ``store``: the backend's episode store, whose methods take the connection ``steps``
    # hands them (blocking on SQLite, coroutines on PostgreSQL).
    def __init__(self, steps: Steps, store: Any, pipeline: EmbeddingPipeline | None,
                 embed_query: Callable[[str], Awaitable[list[float]]],
                 keyword_weight: float) -> None:
        self._steps = steps
        self.store = store
        self._pipeline = pipeline
        self._embed_query = embed_query
        self._model = pipeline.embedder.model_id if pipeline is not None else None
        self._keyword_weight = keyword_weight

    # -- writing -------------------------------------------------------------------------

    async def embed(self, text: str) -> list[float] | None:
        if self._pipeline is None:
            return None
        try:
            return (await self._pipeline.embed_batch([self._pipeline.text_to_send(text)]))[0]
        except EmbedderError as exc:
            log.warning("memory.episodes.embed_failed", error=str(exc),
                        effect="no novelty check, keyword search")
            return None

    async def write(self, draft: EpisodeDraft, merge_into: int | None) -> Episode:
        if draft.vector is not None:
            draft = dataclasses.replace(draft, vector_model=self._model)
        written: Episode
        if merge_into is not None:
            written = await self._write("merging an episode", self.store.merge, merge_into, draft,
                                        grows=True)
        else:
            written = await self._write("writing an episode", self.store.insert, draft, grows=True)
        return written

    async def closest(self, user: str, vector: list[float]) -> tuple[Episode, float] | None:
        """The recent episode most like ``vector`` (novelty check), with its cosine."""
        rows = await self._read(lambda db: self.store.with_vectors(db, user, self._model, 50))
        scored = [(e, cosine(vector, v))
                  for e, v in rows if v is not None and len(v) == len(vector)]
        return max(scored, key=lambda p: p[1]) if scored else None

    async def last_of_session(self, user: str, session_key: str) -> Episode | None:
        result: Episode | None = await self._read(
            lambda db: self.store.last_of_session(db, user, session_key))
        return result

    async def count_since(self, user: str, since_ms: int) -> int:
        result: int = await self._read(lambda db: self.store.count_since(db, user, since_ms))
        return result

    async def enqueue(self, user: str, session_key: str) -> None:
        await self._write("queueing an episode", self.store.enqueue, user, session_key,
                          int(time.time() * 1000), grows=True)

    async def due(self) -> list[EpisodeJob]:
        # A write: on PostgreSQL taking a job claims it from the other nodes.
        result: list[EpisodeJob] = await self._write("taking episode jobs", self.store.take_due,
                                                     int(time.time() * 1000))
        return result

    async def job_done(self, job_id: int) -> None:
        await self._write("finishing an episode job", self.store.done, job_id)

    async def job_failed(self, job: EpisodeJob, error: str, retry_s: float,
                         max_attempts: int) -> bool:
        """Record a failed attempt; True when it was the last one allowed."""
        give_up = job.attempts + 1 >= max_attempts
        next_ms = int((time.time() + retry_s * 2 ** job.attempts) * 1000)
        await self._write("recording an episode failure", self.store.failed_attempt, job.id, error,
                          next_ms, give_up)
        return give_up

    async def queue_state(self) -> dict[str, int]:
        result: dict[str, int] = await self._read(self.store.queue_state)
        return result

    async def prune_older_than(self, cutoff_ms: int) -> int:
        result: int = await self._write("expiring episodes", self.store.delete_older_than,
                                        cutoff_ms)
        return result

    async def forget(self, user: str, session_key: str | None, after_ms: int | None,
                     before_ms: int | None) -> int:
        result: int = await self._write("forgetting episodes", self.store.delete_for, user,
                                        session_key, after_ms, before_ms)
        return result

    # -- reading -------------------------------------------------------------------------

    async def page(self, user: str, *, limit: int,
                   before: int | None) -> tuple[list[Episode], int | None]:
        rows = await self._read(lambda db: self.store.page(db, user, limit=limit + 1,
                                                           before=before))
        more = len(rows) > limit
        rows = rows[:limit]
        return rows, (rows[-1].id if more and rows else None)

    async def search(self, user: str, query: str, *, limit: int,
                     window: tuple[int, int] | None = None, recency: float = 0.0,
                     half_life_days: float = 30.0) -> list[ScoredEpisode]:
        """The user's episodes best matching ``query``, best first (see the module docstring)."""
        rows = await self._read(lambda db: self.store.with_vectors(db, user, self._model,
                                                                   _CANDIDATES))
        if window is not None:
            rows = [(e, v)
                    for e, v in rows if e.covered_ms >= window[0] and e.created_ms < window[1]]
        if not rows:
            return []
        qvec: list[float] | None = None
        if self._pipeline is not None and any(v is not None for _, v in rows):
            try:
                qvec = await self._embed_query(query)
            except EmbedderError as exc:
                log.warning("memory.episodes.query_embed_failed", error=str(exc))
        now_ms = time.time() * 1000
        w = self._keyword_weight if qvec is not None else 1.0
        qterms = content_terms(query)

        def rank() -> list[ScoredEpisode]:
            out = []
            for episode, vec in rows:
                eterms = content_terms(episode.text + " " + episode.theme)
                keyword = (len(qterms & eterms) / max(1, min(len(qterms), len(eterms))) if eterms
                           else 0.0)
                vector = (cosine(qvec, vec)
                          if qvec is not None and vec is not None and len(vec) == len(qvec)
                          else 0.0)
                relevance = w * keyword + (1 - w) * vector
                age_days = max(0.0, now_ms - episode.updated_ms) / _DAY_MS
                fresh = 0.5 ** (age_days / half_life_days)
                out.append(ScoredEpisode(episode, (1 - recency) * relevance + recency * fresh))
            out.sort(key=lambda s: (-s.score, -s.episode.updated_ms))
            return out[:limit]

        return await asyncio.to_thread(rank)

    # -- plumbing ------------------------------------------------------------------------

    async def _write(self, action: str, fn: Callable[..., Any], *args: object,
                     grows: bool = False) -> Any:
        return await self._steps.write(action, fn, *args, grows=grows)

    async def _read(self, fn: Callable[..., Any]) -> Any:
        return await self._steps.read("reading episodes", fn)
