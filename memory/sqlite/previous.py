"""The previous embedder on SQLite: its vectors come from the embedding cache, in memory.

:class:`SqlitePreviousModel` is :class:`memory.embedders.previous.PreviousModel` (which identity
serves, its query embedder, the reasons) with the SQLite half of serving it,
:mod:`memory.sqlite.interim`: the previous identity's cached vectors as in-memory sign bits,
warmed once the model is built and released with it. Without numpy there are none to keep, and
the search is keyword-only with that reason.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any

import apsw
import structlog

from memory.config import MemoryConfig
from memory.embedders.previous import EmbedderIdentity, PreviousFactory, PreviousModel
from memory.sqlite import interim
from memory.sqlite.index import knn

__all__ = ["SqlitePreviousModel"]

log = structlog.get_logger("memory.service")

# Runs a function on one of the service's read connections, in a worker thread.
ReadFn = Callable[[Callable[[apsw.Connection], Any]], Awaitable[Any]]


class SqlitePreviousModel(PreviousModel):
    """The previous identity's query embedder and its in-memory vectors while a rebuild runs."""

    def __init__(self, config: MemoryConfig, db_path: os.PathLike[str],
                 factory: PreviousFactory | None) -> None:
        super().__init__(config, factory)
        self.db_path = db_path
        # Handed to each search, which never looks it up: a search that outlives the rebuild
        # then loads into this released object, not into a fresh registry entry nobody frees.
        self._vectors: interim.PreviousVectors | None = None
        self._warming: asyncio.Task[None] | None = None

    def unavailable(self) -> str | None:
        return None if knn.HAVE_NUMPY else "serving the previous model's vectors needs numpy >= 2.0"

    async def update_from(self, previous: EmbedderIdentity | None, read: ReadFn) -> None:
        """Serve ``previous`` from now on; ``read`` runs a function on a read connection."""

        async def dims_of(identity: EmbedderIdentity) -> int | None:
            dims: int | None = await read(lambda db: interim.cached_dims(db, identity))
            return dims

        if not await self.update(previous, dims_of) or previous is None:
            return
        vectors = self._vectors = interim.vectors_for(self.db_path, previous)
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

    @property
    def vectors(self) -> interim.PreviousVectors | None:
        """The previous identity's vectors while its model serves (what a search ranks its
        query against)."""
        return self._vectors

    async def close(self) -> None:
        """Let go of the embedder and the in-memory sign bits (safe to call twice)."""
        self._vectors = None
        interim.release(self.db_path)   # a running warm-up stops at its next batch
        warming, self._warming = self._warming, None
        if warming is not None:
            await asyncio.gather(warming, return_exceptions=True)
        await super().close()
