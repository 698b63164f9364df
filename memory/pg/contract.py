"""The sessions tables as the memory indexer reads them, and a stand-in writer for tests.

``recalld_sessions`` and ``recalld_messages`` belong to the sessions package (its PostgreSQL
store creates them and is their only writer in the product). Until that store is wired in,
the memory tests and ``bench/recall.py --backend postgres`` create the same tables from this
copy of the agreed contract and append through :func:`append_message`, which does what the
store promises: one ``INSERT`` at the next ``seq``, the session's counters moved, and
``NOTIFY recalld_messages`` in the same transaction. Product code never calls these.
"""

from __future__ import annotations

import psycopg

__all__ = ["SESSIONS_DDL", "append_message", "create_session", "create_session_tables"]

SESSIONS_DDL = """
CREATE TABLE IF NOT EXISTS recalld_sessions (
  session_key   text PRIMARY KEY,
  user_id       text NOT NULL,
  title         text NOT NULL,
  system_prompt text,
  model         text,
  memory        boolean NOT NULL DEFAULT true,
  created_at    text NOT NULL,
  updated_at    text NOT NULL,
  message_count integer NOT NULL DEFAULT 0,
  bytes         bigint  NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS recalld_messages (
  session_key text NOT NULL REFERENCES recalld_sessions ON DELETE CASCADE,
  seq         bigint NOT NULL,
  id          text NOT NULL,
  role        text NOT NULL,
  content     text NOT NULL,
  ts          text NOT NULL,
  run_id      text,
  name        text,
  extra       jsonb NOT NULL DEFAULT '{}',
  PRIMARY KEY (session_key, seq));
"""


def create_session_tables(conn: psycopg.Connection[object]) -> None:
    with conn.transaction():
        conn.execute(SESSIONS_DDL.encode())


def create_session(conn: psycopg.Connection[object], user: str, session_key: str, *, title: str = "",
                   created_at: str, memory: bool = True) -> None:
    with conn.transaction():
        conn.execute("INSERT INTO recalld_sessions (session_key, user_id, title, memory, created_at, updated_at) "
                     "VALUES (%s, %s, %s, %s, %s, %s)", (session_key, user, title, memory, created_at, created_at))


def append_message(conn: psycopg.Connection[object], session_key: str, *, message_id: str, role: str,
                   content: str, ts: str, name: str | None = None, run_id: str | None = None) -> int:
    """Append one message as the sessions store does; returns its ``seq``."""
    with conn.transaction():
        row = conn.execute("SELECT message_count FROM recalld_sessions WHERE session_key = %s FOR UPDATE",
                           (session_key,)).fetchone()
        assert row is not None, session_key
        seq_row = conn.execute("SELECT coalesce(max(seq) + 1, 0) FROM recalld_messages WHERE session_key = %s",
                               (session_key,)).fetchone()
        seq = int(seq_row[0]) if seq_row else 0  # type: ignore[index]
        conn.execute("INSERT INTO recalld_messages (session_key, seq, id, role, content, ts, run_id, name) "
                     "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                     (session_key, seq, message_id, role, content, ts, run_id, name))
        conn.execute("UPDATE recalld_sessions SET message_count = message_count + 1, updated_at = %s, "
                     "bytes = bytes + %s WHERE session_key = %s", (ts, len(content.encode()), session_key))
        conn.execute("SELECT pg_notify('recalld_messages', %s)", (session_key,))
    return seq

