"""One store step on a pooled connection: what ``memory.sqlite.index.db.write_step``/``read_step``
are for the SQLite index (a step there runs in a thread; here it is awaited).

A PostgreSQL failure becomes :class:`~memory.errors.MemoryStorageError` naming the action, as
a SQLite one does, so the gateway answers it as a storage error and never repeats the DSN.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from memory.errors import MemoryStorageError

__all__ = ["Pool", "PoolSteps", "pooled_step"]

Pool: TypeAlias = AsyncConnectionPool[AsyncConnection[TupleRow]]
_T = TypeVar("_T")


async def pooled_step(pool: Pool, action: str, fn: Callable[..., Awaitable[_T]], *args: Any) -> _T:
    """``await fn(conn, *args)`` on a connection of ``pool``."""
    try:
        async with pool.connection() as conn:
            return await fn(conn, *args)
    except psycopg.Error as exc:
        raise MemoryStorageError(f"memory index failed while {action}: "
                                 f"{type(exc).__name__}") from exc


class PoolSteps:
    """:class:`memory.steps.Steps` on a pool: each step awaited on a pooled connection. ``grows``
    is not checked: the disk is the database server's (docs/sessions.md)."""

    __slots__ = ("_pool",)

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def write(self, action: str, fn: Callable[..., Awaitable[_T]], *args: object,
                    grows: bool = False) -> _T:
        return await pooled_step(self._pool, action, fn, *args)

    async def read(self, action: str, fn: Callable[..., Awaitable[_T]]) -> _T:
        return await pooled_step(self._pool, action, fn)
