"""Where a store's step runs: the one seam between memory's rules and a backend's connections.

A rule (saving a fact, writing an episode, …) calls ``await steps.write(action, fn, *args)``
or ``await steps.read(action, fn)``; the backend decides what that means. On SQLite
(:class:`memory.sqlite.index.db.IndexSteps`) ``fn`` is blocking and runs in a worker thread on
the index's one writing connection (holding its lock) or a pooled reader; on PostgreSQL
(:class:`memory.pg.steps.PoolSteps`) ``fn`` is a coroutine awaited on a pooled connection. Either
way a storage failure becomes :class:`~memory.errors.MemoryStorageError` naming ``action``.

So the rule is written once and its store's methods keep their backend's natural style
(blocking apsw calls, awaited psycopg calls) without a second copy of the rule to cross it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["Steps"]


class Steps(Protocol):
    async def write(self, action: str, fn: Callable[..., Any], *args: object,
                    grows: bool = False) -> Any:
        """``fn(connection, *args)`` as one write; ``grows``: it adds rows, so a backend that
        guards its own disk refuses it below the free-disk floor."""
        ...

    async def read(self, action: str, fn: Callable[..., Any]) -> Any:
        """``fn(connection)`` on a connection that only reads."""
        ...
