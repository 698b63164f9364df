"""What the memory indexer reads of the sessions' tables on PostgreSQL, so the schema has one owner.

On SQLite the memory indexer follows transcripts with this package's own reader; on PostgreSQL
it reads through this module instead, never naming a table or channel of the sessions store
(``tests/gateway/test_layers.py`` fails when a module outside ``sessions/`` does). Memory
keeps its own progress per session and composes :data:`MEMORY_SESSIONS` into its statements,
so its claim stays one ``… FOR UPDATE OF p SKIP LOCKED`` statement over both packages' rows.

* :data:`MEMORY_SESSIONS` — the sessions memory may index (memory on), as a relation:
  ``session_key, user_id, updated_at, message_count``; a session changed since memory's mark
  when its ``updated_at`` or ``message_count`` moved from what memory recorded.
* :func:`messages_from` — a session's messages from a ``seq`` on, in order.
* :func:`count_through` — how many message rows a session has up to a ``seq`` (fewer than
  were indexed: a purge).
* :data:`NOTIFY_CHANNEL`, :func:`listen`, :func:`wake` — the change notifications: every
  committed append sends the session key on the channel; :func:`wake` sends an empty payload
  (every listener's pass, no session in particular).
* :func:`ready` — whether the sessions' tables exist yet (the store's migrations made them).

Reached from memory as ``sessions.pg_feed`` (the package's top level, imported on first use:
it needs psycopg).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from psycopg import AsyncConnection

__all__ = [
    "MEMORY_SESSIONS",
    "NOTIFY_CHANNEL",
    "FeedMessage",
    "count_through",
    "listen",
    "messages_from",
    "ready",
    "wake",
]

#: The channel an append notifies, with the session key as payload (the indexer listens).
NOTIFY_CHANNEL = "recalld_messages"

#: The sessions with memory on, as a parenthesised relation to alias and join.
MEMORY_SESSIONS = ("(SELECT session_key, user_id, updated_at, message_count FROM recalld_sessions"
                   " WHERE memory)")

_MESSAGES_FROM_SQL = """
SELECT seq, id, role, content, ts, run_id, name, extra->'replaces' FROM recalld_messages
WHERE session_key = %s AND seq >= %s ORDER BY seq
"""

_COUNT_THROUGH_SQL = "SELECT count(*) FROM recalld_messages WHERE session_key = %s AND seq <= %s"

_READY_SQL = ("SELECT to_regclass('recalld_sessions') IS NOT NULL"
              " AND to_regclass('recalld_messages') IS NOT NULL")

_Conn = AsyncConnection[Any]


class FeedMessage(NamedTuple):
    """One message row as the indexer reads it; ``replaces`` is the id its ``extra`` says it
    replaces (an edit or regenerate), else whatever JSON value is there (usually None)."""

    seq: int
    id: str
    role: str
    content: str
    ts: str
    run_id: str | None
    name: str | None
    replaces: Any


async def ready(conn: _Conn) -> bool:
    row = await (await conn.execute(_READY_SQL)).fetchone()
    return bool(row and row[0])


async def messages_from(conn: _Conn, session_key: str, seq: int) -> list[FeedMessage]:
    rows = await (await conn.execute(_MESSAGES_FROM_SQL, (session_key, seq))).fetchall()
    return [FeedMessage(*row) for row in rows]


async def count_through(conn: _Conn, session_key: str, seq: int) -> int:
    row = await (await conn.execute(_COUNT_THROUGH_SQL, (session_key, seq))).fetchone()
    return int(row[0]) if row else 0


async def listen(conn: _Conn) -> None:
    """Subscribe ``conn`` (autocommit) to the change notifications."""
    await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")


async def wake(conn: _Conn) -> None:
    """Wake every listener (an empty payload: no session in particular)."""
    await conn.execute("SELECT pg_notify(%s, '')", (NOTIFY_CHANNEL,))
