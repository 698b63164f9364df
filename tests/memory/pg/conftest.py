"""Helpers for the PostgreSQL memory tests: a migrated database with the sessions tables, and
sessions written by the real sessions store (:class:`sessions.PgSessionStore`, their owner;
the memory indexer only reads them)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterable

import psycopg
import pytest
from psycopg import AsyncConnection
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from memory.pg.migrations import migrate
from sessions import PgSessionStore
from tests.memory.conftest import name_of, session_key, ts


@pytest.fixture
def pg_index(pg_dsn: str) -> str:
    """A database with the memory schema and the sessions store's tables; its DSN."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        migrate(conn)
    PgSessionStore(pg_dsn, pool_size=1).close()  # its migrations make recalld_sessions/_messages
    return pg_dsn


@pytest.fixture
async def pool(pg_index: str) -> AsyncIterator[AsyncConnectionPool[AsyncConnection[TupleRow]]]:
    async with AsyncConnectionPool(pg_index, min_size=1, max_size=4, open=False) as p:
        yield p


def key_of(name: str) -> str:
    """The session key of the session a test calls ``name`` (a key is its own name)."""
    return name if re.fullmatch(r"[0-9a-f]{32}", name) else session_key(name)


def name_for(key: str) -> str:
    """What a test calls the session ``key`` (the key itself when it was given as one)."""
    try:
        return name_of(key)
    except KeyError:
        return key


def sessions_store(dsn: str, name: str | None = None) -> PgSessionStore:
    """The real sessions store on ``dsn``; a session it creates is keyed ``key_of(name)``."""
    return PgSessionStore(dsn, pool_size=1, key_factory=lambda: key_of(name or "unnamed"))


def add_session(dsn: str, user: str, name: str, messages: Iterable[str | tuple[str, str]], *,
                start_minute: float = 0, memory: bool = True, create: bool = True) -> None:
    """A session (unless ``create`` is False) and its messages, through the sessions store,
    alternating user/assistant unless given as ``(role, text)``, a minute apart from
    ``start_minute``."""
    with sessions_store(dsn, name) as store:
        if create:
            store.create(user, title=name, created_at=ts(start_minute), memory=memory)
        for i, item in enumerate(messages):
            role, text = item if isinstance(item, tuple) else (("user", "assistant")[i % 2], item)
            store.append_message(user, key_of(name), role=role, content=text,
                                 ts=ts(start_minute + i))


def chunk_rows(dsn: str, name: str | None = None) -> list[tuple[str, int, str, int, int]]:
    """(session's test name, chunk_idx, content, line_start, line_end) of every chunk, in order."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT session_key, chunk_idx, content, line_start, line_end "
            "FROM recalld_memory_chunks "
            "WHERE %(key)s::text IS NULL OR session_key = %(key)s ORDER BY session_key, chunk_idx",
            {"key": key_of(name) if name is not None else None}).fetchall()
    return [(name_for(str(a)), int(b), str(c), int(d), int(e)) for a, b, c, d, e in rows]
