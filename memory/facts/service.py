"""``Facts``: remembered facts' rules on either backend, each store step run through
:class:`~memory.steps.Steps`.

Saving embeds the new text first (when an embedder is active), then hands the draft to the
backend's fact store (``memory.sqlite.facts.FactStore``, ``memory.pg.facts.PgFactStore``), whose
one transaction does the two-tier dedup of :mod:`memory.facts.rules`: the
same normalised text (SHA-256, per user) is the same fact; an active fact whose cosine to the
new one reaches ``memory.facts_dedup_threshold`` is updated rather than duplicated. An
embedder that fails leaves only the exact tier; the fact is still saved.

:meth:`Facts.relevant` picks the facts for a prompt: a small hybrid search over the user's
active facts (keyword overlap and cosine, weighted like the chunk search), cut to a count and a
token budget. Per-user fact sets are small (``memory.facts_max_per_user``), so both legs are
scored in Python over every active fact rather than through FTS5 and sqlite-vec.

:class:`FactsPage` and :class:`ScoredFact` live in :mod:`memory.facts.values`; they are
re-exported here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from memory.chunking import approx_tokens, content_terms
from memory.embedders.embeddings import EmbeddingPipeline
from memory.errors import EmbedderError
from memory.facts.rules import cosine
from memory.facts.values import Fact, FactChange, FactDraft, FactsPage, ScoredFact
from memory.steps import Steps

__all__ = ["Facts", "FactsPage", "ScoredFact"]

log = structlog.get_logger("memory.facts")

# Facts embedded lazily per prompt when they lack a vector of the current embedder (saved while
# none was active, or under another one): a bound on the work one run can cause.
_BACKFILL_PER_CALL = 64


class Facts:
    # ``store``: the backend's fact store, whose methods take the connection ``steps`` hands
    # them (blocking on SQLite, coroutines on PostgreSQL); the rules below never see which.
    def __init__(self, steps: Steps, store: Any, pipeline: EmbeddingPipeline | None,
                 embed_query: Callable[[str], Awaitable[list[float]]],
                 keyword_weight: float) -> None:
        self._steps = steps
        self.store = store
        self._pipeline = pipeline
        # the service's, which shares recent query vectors with recall
        self._embed_query = embed_query
        self._model = pipeline.embedder.model_id if pipeline is not None else None
        self._keyword_weight = keyword_weight

    async def add(self, user: str, text: str, *, source: str, replaces: int | None = None,
                  session_key: str | None = None, run_id: str | None = None,
                  client: str | None = None) -> FactChange:
        """Save ``text`` for ``user``: added, merged into a near-duplicate, or replacing
        ``replaces``; ``client`` names the client token it came through (None: the user's own
        token)."""
        clean = self.store.check_text(text)
        vector = await self._embed_passage(clean)
        draft = FactDraft(user, clean, source, replaces, session_key, run_id, vector,
                          self._model if vector is not None else None, client)
        change: FactChange = await self._write("saving a fact", self.store.save, draft, grows=True)
        log.info("memory.fact", action=change.action, fact=change.fact.id,
                 previous=change.previous_id, source=source)
        return change

    async def update(self, user: str, fact_id: int, text: str, *,
                     client: str | None = None) -> FactChange:
        """The user's own correction: a new version of ``fact_id``, never merged elsewhere."""
        return await self.add(user, text, source="user", replaces=fact_id, client=client)

    async def delete(self, user: str, fact_id: int) -> FactChange:
        change: FactChange = await self._write("deleting a fact", self.store.delete, user, fact_id)
        log.info("memory.fact", action="deleted", fact=fact_id)
        return change

    async def get(self, user: str, fact_id: int) -> Fact:
        result: Fact = await self._read("reading a fact",
                                        lambda db: self.store.get(db, user, fact_id))
        return result

    async def page(self, user: str, *, limit: int, before: int | None = None,
                   include_inactive: bool = False) -> FactsPage:
        facts = await self._read("listing facts", lambda db: self.store.page(
            db, user, limit=limit + 1, before=before, include_inactive=include_inactive))
        more = len(facts) > limit
        facts = facts[:limit]
        return FactsPage(facts, facts[-1].id if more and facts else None)

    async def history(self, user: str, fact_id: int) -> list[Fact]:
        result: list[Fact] = await self._read("reading a fact's history",
                                              lambda db: self.store.history(db, user, fact_id))
        return result

    async def forget_derived(self, user: str, session_key: str | None, after_ms: int | None,
                             before_ms: int | None) -> int:
        result: int = await self._write("forgetting facts", self.store.delete_derived, user,
                                        session_key, after_ms, before_ms)
        return result

    async def prune_older_than(self, cutoff_ms: int) -> int:
        """Retention: delete facts (every version) not said since ``cutoff_ms``."""
        result: int = await self._write("expiring facts", self.store.delete_older_than, cutoff_ms)
        return result

    async def relevant(self, user: str, query: str, *, limit: int,
                       budget_tokens: int) -> list[ScoredFact]:
        """The active facts most related to ``query``, best first, within ``limit`` and the
        budget."""
        rows = await self._read("reading facts",
                                lambda db: self.store.active_with_vectors(db, user, self._model))
        if not rows:
            return []
        qvec: list[float] | None = None
        if self._pipeline is not None:
            rows = await self._backfill(rows)
            try:
                qvec = await self._embed_query(query)
            except EmbedderError as exc:
                log.warning("memory.facts.query_embed_failed", error=str(exc),
                            effect="keyword scoring only")
        # Scoring is pure Python over every active fact: off the event loop.
        return await asyncio.to_thread(_rank, rows, qvec, content_terms(query),
                                       self._keyword_weight if qvec is not None else 1.0, limit,
                                       budget_tokens)

    # -- plumbing ------------------------------------------------------------------------

    async def _embed_passage(self, text: str) -> list[float] | None:
        if self._pipeline is None:
            return None
        try:
            return (await self._pipeline.embed_batch([self._pipeline.text_to_send(text)]))[0]
        except EmbedderError as exc:
            log.warning("memory.facts.embed_failed", error=str(exc), effect="exact dedup only")
            return None

    async def _backfill(self, rows: list[tuple[Fact, list[float] | None]]
                        ) -> list[tuple[Fact, list[float] | None]]:
        missing = [fact for fact, vec in rows if vec is None][:_BACKFILL_PER_CALL]
        if not missing or self._pipeline is None or self._model is None:
            return rows
        try:
            vectors = await self._pipeline.embed_batch([self._pipeline.text_to_send(f.text)
                                                        for f in missing])
        except EmbedderError as exc:
            log.warning("memory.facts.embed_failed", error=str(exc),
                        effect="facts scored by keywords")
            return rows
        model = self._model
        await self._write("storing fact vectors", self.store.store_vectors,
                          [(f.id, v) for f, v in zip(missing, vectors, strict=True)], model)
        fresh = {f.id: v for f, v in zip(missing, vectors, strict=True)}
        return [(fact, vec if vec is not None else fresh.get(fact.id)) for fact, vec in rows]

    async def _write(self, action: str, fn: Callable[..., Any], *args: object,
                     grows: bool = False) -> Any:
        return await self._steps.write(action, fn, *args, grows=grows)

    async def _read(self, action: str, fn: Callable[..., Any]) -> Any:
        return await self._steps.read(action, fn)


def _rank(rows: list[tuple[Fact, list[float] | None]], qvec: list[float] | None, qterms: set[str],
          w: float, limit: int, budget_tokens: int) -> list[ScoredFact]:
    scored: list[ScoredFact] = []
    for fact, vec in rows:
        fterms = content_terms(fact.text)
        keyword = len(qterms & fterms) / len(fterms) if fterms else 0.0
        vector = (cosine(qvec, vec)
                  if qvec is not None and vec is not None and len(vec) == len(qvec) else 0.0)
        scored.append(ScoredFact(fact, w * keyword + (1 - w) * vector))
    # Ties (no overlap at all) go to the newest fact: it is the likeliest still true.
    scored.sort(key=lambda s: (-s.score, -s.fact.id))
    out: list[ScoredFact] = []
    spent = 0
    for item in scored[:limit]:
        cost = approx_tokens(item.fact.text) + 4
        if out and spent + cost > budget_tokens:
            break
        spent += cost
        out.append(item)
    return out
