"""Helpers for the PostgreSQL memory tests: a migrated database with the sessions tables, and
sessions written as the sessions store writes them (``memory.pg.contract``)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterable

import psycopg
import pytest
from psycopg import AsyncConnection
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from memory.pg.contract import append_message, create_session, create_session_tables
from memory.pg.migrations import migrate
from tests.memory.conftest import ts


@pytest.fixture
def pg_index(pg_dsn: str) -> str:
    """A database with the memory schema and the sessions tables; its DSN."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        migrate(conn)
        create_session_tables(conn)
    return pg_dsn


@pytest.fixture
async def pool(pg_index: str) -> AsyncIterator[AsyncConnectionPool[AsyncConnection[TupleRow]]]:
    async with AsyncConnectionPool(pg_index, min_size=1, max_size=4, open=False) as p:
        yield p


def add_session(dsn: str, user: str, key: str, messages: Iterable[str | tuple[str, str]], *,
                start_minute: float = 0, memory: bool = True, create: bool = True) -> None:
    """A session (unless ``create`` is False) and its messages, alternating user/assistant unless
    given as ``(role, text)``, dated a minute apart from ``start_minute``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if create:
            create_session(conn, user, key, title=key, created_at=ts(start_minute), memory=memory)
        for i, item in enumerate(messages):
            role, text = item if isinstance(item, tuple) else (("user", "assistant")[i % 2], item)
            append_message(conn, key, message_id=uuid.uuid4().hex, role=role, content=text,
                           ts=ts(start_minute + i))


def chunk_rows(dsn: str, key: str | None = None) -> list[tuple[str, int, str, int, int]]:
    """(session, chunk_idx, content, line_start, line_end) of every chunk, in order."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT session_key, chunk_idx, content, line_start, line_end FROM recalld_memory_chunks "
            "WHERE %(key)s::text IS NULL OR session_key = %(key)s ORDER BY session_key, chunk_idx",
            {"key": key}).fetchall()
    return [(str(a), int(b), str(c), int(d), int(e)) for a, b, c, d, e in rows]
