"""The previous embedder: who serves the vector leg while the vectors are rebuilt for a new one.

An embedder change (another provider, model, endpoint or width: an :class:`EmbedderIdentity`)
makes every stored vector useless to the new model's queries; both backends rebuild them from
the embedding cache and the embedder. Until the rebuild ends, the vectors of the identity that
was complete before it (:attr:`RebuildState.previous`) still rank the old model's queries, so
:class:`PreviousModel` builds a query-only embedder for that identity (the configuration's
:func:`~memory.embedders.embeddings.previous_embedder`, or a factory a test passes), embeds each
search's query with it and lets go of it once the rebuild is over. When it cannot be built (an
unknown provider, a model no longer installed, another endpoint) or a query fails, the search is
keyword-only and says why. No ranking ever mixes two models' vectors.

Where the previous vectors are, and how the leg reads them, is each backend's: SQLite keeps the
previous model's sign bits in memory over its embedding cache (:mod:`memory.sqlite.interim`),
PostgreSQL keeps the old vectors in a column of their own (:mod:`memory.pg.vectors`). What is
written here once: the rule of which identity serves, the query embedder's life, the reasons a
search and ``memory.status`` give, and ``vectorSearch``'s shape.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from memory.config import MemoryConfig
from memory.embedders.embeddings import Embedder, EmbeddingPipeline, previous_embedder
from memory.errors import EmbedderError

__all__ = [
    "NOT_BUILT",
    "NOT_REBUILDING",
    "EmbedderIdentity",
    "PreviousFactory",
    "PreviousModel",
    "PreviousQuery",
    "RebuildState",
    "RoutedQuery",
    "complete_identity",
    "default_factory",
    "rebuild_state",
    "rebuilding_reason",
    "relevance_floor",
    "route_query",
    "vector_search_status",
]

log = structlog.get_logger("memory.service")  # the name these events always had


@dataclass(frozen=True, slots=True)
class EmbedderIdentity:
    """Whose vectors these are: an embedder's provider, model id and endpoint hash."""

    provider: str
    model: str
    endpoint_hash: str

    @classmethod
    def of(cls, embedder: Embedder) -> EmbedderIdentity:
        return cls(embedder.provider, embedder.model_id, embedder.endpoint_hash)

    def to_json(self) -> str:
        return json.dumps([self.provider, self.model, self.endpoint_hash])

    @classmethod
    def from_json(cls, text: str | None) -> EmbedderIdentity | None:
        """The identity :meth:`to_json` wrote, or None for nothing (or something unreadable)."""
        if not text:
            return None
        try:
            provider, model, endpoint = json.loads(text)
        except (ValueError, TypeError):
            return None
        return cls(str(provider), str(model), str(endpoint))


@dataclass(frozen=True, slots=True)
class RebuildState:
    """Where vectors stand after an embedder change (each backend reads it from its index)."""

    rebuilding: bool   # the configured identity's vectors are still to be (re)built
    started: bool      # the old vectors are dropped and chunks pending (else the next sync
                       # starts it)
    previous: EmbedderIdentity | None   # whose complete vectors may serve meanwhile


NOT_REBUILDING = RebuildState(False, False, None)

# Why the vector leg does not run with the configured embedder, while its vectors are rebuilt.
NOT_BUILT = "vectors not built yet for this embedder"


def rebuilding_reason(pending: int) -> str:
    return f"vectors being rebuilt for a new embedder ({pending} chunks to go)"


def complete_identity(stored: str | None, rebuilding: bool,
                      previous: str | None) -> EmbedderIdentity | None:
    """The identity whose vectors were all built before a change, from the index's records (its
    identity, whether a rebuild runs, that rebuild's previous identity): the stored one unless a
    rebuild was already running, whose own previous identity then stays the one to serve (the
    half-built one never does)."""
    return EmbedderIdentity.from_json(previous if rebuilding else stored)


def rebuild_state(identity: EmbedderIdentity | None, stored: str | None, rebuilding: bool,
                  previous: str | None) -> RebuildState:
    """Whether ``identity``'s vectors are still to be (re)built after an identity change, and the
    identity whose complete vectors serve meanwhile, from the index's records (as
    :func:`complete_identity` reads them)."""
    if identity is None:
        return NOT_REBUILDING
    if stored == identity.to_json():
        # A rebuild of the same identity (SQLite's vectors_stale) records no previous one.
        return RebuildState(rebuilding, rebuilding,
                            EmbedderIdentity.from_json(previous) if rebuilding else None)
    if not stored:
        return NOT_REBUILDING   # a first build, not a rebuild: no earlier vectors exist
    # Not started yet (the index's next sync starts it): what that start will record.
    before = complete_identity(stored, rebuilding, previous)
    return RebuildState(True, False, before if before != identity else None)


def relevance_floor(config: MemoryConfig, previous_served: bool, embedder: Embedder | None,
                    previous: PreviousModel) -> float | None:
    """Recall's floor on the cosines of a search's hits: the configured one, else the calibrated
    floor of the model whose cosines they are (the previous model's when it served the leg);
    embedders without one (remote, test fakes) get none."""
    if config.recall_min_similarity is not None:
        return config.recall_min_similarity
    if previous_served:
        return previous.relevance_floor
    floor: float | None = getattr(embedder, "relevance_floor", None)
    return floor

# Builds the query embedder of a previous identity: (embedder, why) or (None, why not).
PreviousFactory = Callable[[EmbedderIdentity], tuple[Embedder | None, str]]


def default_factory(config: MemoryConfig) -> PreviousFactory:
    return lambda identity: previous_embedder(config, identity.provider, identity.model,
                                              identity.endpoint_hash)


@dataclass(frozen=True, slots=True)
class PreviousQuery:
    """A search's query by the previous model: its vector and whose it is, or neither and why
    (the search is then keyword-only); ``reason`` is the search's ``fallbackReason`` either way."""

    vector: list[float] | None
    identity: EmbedderIdentity | None
    reason: str


@dataclass(frozen=True, slots=True)
class _Held:
    identity: EmbedderIdentity
    embedder: Embedder
    pipeline: EmbeddingPipeline
    dims: int | None  # the width of its stored vectors


class PreviousModel:
    """The previous identity's query embedder while a rebuild runs (see the module docstring).

    A backend asks :meth:`update` after each sync with the identity that should serve now (or
    None), and :meth:`query` in each search whose own vector leg cannot run."""

    def __init__(self, config: MemoryConfig, factory: PreviousFactory | None = None) -> None:
        self.config = config
        self._factory = factory or default_factory(config)
        self._held: _Held | None = None
        self._tried: EmbedderIdentity | None = None   # built, or failed to build, for this one
        self.reason = ""   # why the previous model does not serve, when it does not

    @property
    def serving(self) -> EmbedderIdentity | None:
        """The identity whose vectors the vector leg uses now instead of the configured one."""
        return self._held.identity if self._held else None

    @property
    def relevance_floor(self) -> float | None:
        return getattr(self._held.embedder, "relevance_floor", None) if self._held else None

    def unavailable(self) -> str | None:
        """Why this backend cannot serve a previous model at all (None: it can)."""
        return None

    async def update(self, previous: EmbedderIdentity | None,
                     dims_of: Callable[[EmbedderIdentity], Awaitable[int | None]]) -> bool:
        """Serve ``previous`` from now on (None: the rebuild is over, or nothing can serve);
        ``dims_of`` reads the width of that identity's stored vectors. True when a model was
        built here (the backend then prepares what its leg keeps for it)."""
        if previous == self._tried:
            return False
        await self.close()
        self._tried = previous
        if previous is None:
            return False
        cannot = self.unavailable()
        if cannot is not None:
            self.reason = cannot
            return False
        try:
            embedder, why = self._factory(previous)
        except Exception as exc:  # a factory that breaks must not break the sync that asked
            embedder, why = None, ("the previous model could not be built: "
                                   f"{type(exc).__name__}: {exc}")
        if embedder is None:
            self.reason = why
            log.warning("memory.vectors.previous_unavailable", previous=previous.to_json(),
                        reason=why, effect="hybrid is keyword-only until the rebuild ends")
            return False
        pipeline = EmbeddingPipeline.from_config(embedder, self.config)
        self._held = _Held(previous, embedder, pipeline, await dims_of(previous))
        self.reason = ""
        log.info("memory.vectors.previous_serving", previous=previous.to_json(), embedder=why,
                 effect="the vector leg uses the previous model's vectors until the rebuild ends")
        return True

    async def query(self, text: str, why: str) -> PreviousQuery:
        """The query vector of ``text`` by the previous model, for a search whose own vector
        leg is unavailable because of ``why``."""
        held = self._held
        if held is None:
            return PreviousQuery(None, None, f"{why}; {self.reason}" if self.reason else why)
        name = f"{held.identity.provider} {held.identity.model}"
        try:
            vector = await held.pipeline.embed_query(text)
        except EmbedderError as exc:
            return PreviousQuery(None, None, f"{why}; the previous model ({name}) failed to embed "
                                             f"the query: {exc}")
        if held.dims is not None and len(vector) != held.dims:
            return PreviousQuery(None, None, f"{why}; the previous model ({name}) returned "
                                             f"{len(vector)} dimensions, its stored vectors have "
                                             f"{held.dims}")
        return PreviousQuery(vector, held.identity,
                             f"{why}; the vector leg is served by the previous model's vectors "
                             f"({name}) until then")

    async def close(self) -> None:
        """Let go of the embedder (safe to call twice)."""
        held, self._held = self._held, None
        self._tried = None
        self.reason = ""
        if held is not None:
            aclose = getattr(held.embedder, "aclose", None)
            if aclose is not None:
                await aclose()
            log.info("memory.vectors.previous_released", previous=held.identity.to_json())


def vector_search_status(*, ready: bool, why: str, identity: EmbedderIdentity | None,
                         rebuild: RebuildState, previous: PreviousModel, embedded: int,
                         total: int, served_by: EmbedderIdentity | None = None
                         ) -> dict[str, Any]:
    """``memory.status``'s ``vectorSearch``: whether the leg runs (``why`` not), whose vectors
    answer it (``served_by``, when the backend knows better: a superseded PostgreSQL node's own
    earlier ones), and a rebuild's progress (``embedded`` of ``total`` chunks have the new
    model's vector)."""
    serving = served_by or (identity if ready else previous.serving)
    before = rebuild.previous
    return {
        "ready": ready, "reason": why or None,
        # Whose vectors answer the vector leg now (the previous model's during a rebuild).
        "servedBy": {"provider": serving.provider, "model": serving.model} if serving else None,
        "rebuild": {
            # Until the next sync starts the rebuild, "embedded" chunks have old vectors.
            "embedded": embedded if rebuild.started else 0, "total": total,
            "previous": {"provider": before.provider, "model": before.model} if before else None,
            "previousUnavailable": (previous.reason or None) if serving is None else None,
        } if rebuild.rebuilding else None,
    }


@dataclass(frozen=True, slots=True)
class RoutedQuery:
    """What a search's vector leg runs with: the query vector (None: keyword only), whose model
    embedded it when the previous one did, the mode that runs, and why it differs from the
    asked one."""

    vector: list[float] | None
    previous: EmbedderIdentity | None
    mode: str
    fallback: str | None


async def route_query(mode: str, text: str, *, state: tuple[bool, str], rebuilding: bool,
                      embed: Callable[[str], Awaitable[list[float]]] | None,
                      previous: PreviousModel) -> RoutedQuery:
    """Which model embeds a search's query: the configured one when its vector leg may run
    (``state``: whether, and why not), else during a rebuild the previous one, else none (the
    search is keyword-only, and says why)."""
    if mode == "keyword":
        return RoutedQuery(None, None, "keyword", None)
    ready, why = state
    if ready and embed is not None:
        try:
            return RoutedQuery(await embed(text), None, mode, None)
        except EmbedderError as exc:
            why = f"query embedding failed: {exc}"
    elif rebuilding:
        served = await previous.query(text, why)
        if served.vector is not None:
            return RoutedQuery(served.vector, served.identity, mode, served.reason)
        why = served.reason
    return RoutedQuery(None, None, "keyword", why)
