"""The previous embedder, kept for queries while the vectors are rebuilt for a new one.

:class:`PreviousModel` is the service's half of :mod:`memory.sqlite.interim`: after an
embedder change it builds a query-only embedder for the identity whose vectors are complete
(``memory.embedders.embeddings.previous_embedder``, or the factory a test passes), embeds
each search's query with it, and lets go of it, and of the in-memory sign bits, once the
rebuild ends. When it cannot be built (an unknown provider, a model no longer installed,
another endpoint, no numpy) or a query fails, the search is keyword-only with the reason,
exactly as without it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import apsw
import structlog

from memory.config import MemoryConfig
from memory.embedders.embeddings import Embedder, EmbeddingPipeline, previous_embedder
from memory.errors import EmbedderError
from memory.quantize import vector_to_blob
from memory.sqlite import interim
from memory.sqlite.index import knn
from memory.sqlite.index.vectors import EmbedderIdentity

__all__ = ["PreviousFactory", "PreviousModel", "PreviousQuery", "default_factory"]

log = structlog.get_logger("memory.service")

# Builds the query embedder of a previous identity: (embedder, why) or (None, why not).
PreviousFactory = Callable[[EmbedderIdentity], tuple[Embedder | None, str]]
# Runs a function on one of the service's read connections, in a worker thread.
ReadFn = Callable[[Callable[[apsw.Connection], Any]], Awaitable[Any]]


def default_factory(config: MemoryConfig) -> PreviousFactory:
    return lambda identity: previous_embedder(config, identity.provider, identity.model,
                                              identity.endpoint_hash)


@dataclass(frozen=True, slots=True)
class PreviousQuery:
    """What a search's vector leg gets from the previous model: the query vector and the
    vectors to rank it against, or neither and why (the search is then keyword-only)."""

    blob: bytes | None
    vectors: interim.PreviousVectors | None
    reason: str


@dataclass(frozen=True, slots=True)
class _Held:
    identity: EmbedderIdentity
    embedder: Embedder
    pipeline: EmbeddingPipeline
    dims: int | None  # the width of its cached vectors
    # Handed to each search, which never looks it up: a search that outlives the rebuild
    # then loads into this released object, not into a fresh registry entry nobody frees.
    vectors: interim.PreviousVectors


class PreviousModel:
    """The previous identity's query embedder while a rebuild runs (see the module docstring)."""

    def __init__(self, config: MemoryConfig, db_path: os.PathLike[str],
                 factory: PreviousFactory) -> None:
        self.config = config
        self.db_path = db_path
        self._factory = factory
        self._held: _Held | None = None
        self._tried: EmbedderIdentity | None = None   # built, or failed to build, for this one
        self._warming: asyncio.Task[None] | None = None
        self.reason = ""   # why the previous model does not serve, when it does not

    @property
    def serving(self) -> EmbedderIdentity | None:
        """The identity whose vectors the vector leg uses now instead of the configured one."""
        return self._held.identity if self._held else None

    @property
    def relevance_floor(self) -> float | None:
        return getattr(self._held.embedder, "relevance_floor", None) if self._held else None

    async def update(self, previous: EmbedderIdentity | None, read: ReadFn) -> None:
        """Serve ``previous`` from now on (None: the rebuild is over, or there is nothing to
        serve); ``read`` runs a function on a read connection of the index."""
        if previous == self._tried:
            return
        await self.close()
        self._tried = previous
        if previous is None:
            return
        if not knn.HAVE_NUMPY:
            self.reason = "serving the previous model's vectors needs numpy >= 2.0"
            return
        try:
            embedder, why = self._factory(previous)
        except Exception as exc:  # a factory that breaks must not break the sync that asked
            embedder, why = None, ("the previous model could not be built: "
                                   f"{type(exc).__name__}: {exc}")
        if embedder is None:
            self.reason = why
            log.warning("memory.vectors.previous_unavailable", previous=previous.to_json(),
                        reason=why, effect="hybrid is keyword-only until the rebuild ends")
            return
        pipeline = EmbeddingPipeline.from_config(embedder, self.config)
        dims = await read(lambda db: interim.cached_dims(db, previous))
        vectors = interim.vectors_for(self.db_path, previous)
        self._held = _Held(previous, embedder, pipeline, dims, vectors)
        self.reason = ""
        log.info("memory.vectors.previous_serving", previous=previous.to_json(), embedder=why,
                 effect="the vector leg uses the previous model's cached vectors until the "
                        "rebuild ends")
        self._warming = asyncio.create_task(self._warm(vectors, read), name="memory-previous-warm")

    async def _warm(self, vectors: interim.PreviousVectors, read: ReadFn) -> None:
        """Load the previous sign bits now rather than in the first search (interim.warm)."""
        try:
            users, chunks = await read(vectors.warm)
        except interim.Released:
            return
        except Exception:  # a search loads its own user if this failed; never fatal
            log.exception("memory.vectors.previous_warm_failed")
            return
        log.info("memory.vectors.previous_warmed", users=users, chunks=chunks)

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
                                             f"{len(vector)} dimensions, its cached vectors have "
                                             f"{held.dims}")
        return PreviousQuery(vector_to_blob(vector), held.vectors,
                             f"{why}; the vector leg is served by the previous model's vectors "
                             f"({name}) until then")

    async def close(self) -> None:
        """Let go of the embedder and the in-memory sign bits (safe to call twice)."""
        held, self._held = self._held, None
        self._tried = None
        self.reason = ""
        interim.release(self.db_path)   # a running warm-up stops at its next batch
        warming, self._warming = self._warming, None
        if warming is not None:
            await asyncio.gather(warming, return_exceptions=True)
        if held is not None:
            aclose = getattr(held.embedder, "aclose", None)
            if aclose is not None:
                await aclose()
            log.info("memory.vectors.previous_released", previous=held.identity.to_json())
