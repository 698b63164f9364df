"""Bulk loading of whole sessions with ``COPY``, for corpora far larger than appends would write
in reasonable time (``bench/clustersearch.py``'s scale corpus).

The rows must be what :meth:`~sessions.pg.PgSessionStore.append_message` would have written:
``bytes`` and ``line_bytes`` count each transcript line with its newline, ``next_seq`` is the
message count, ``seq`` runs from 0. No notification is sent (a loaded corpus is indexed by an
explicit sync), and the caller commits, sessions before their messages.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import psycopg

__all__ = ["MessageRow", "SessionRow", "copy_messages", "copy_sessions"]


class SessionRow(NamedTuple):
    session_key: str
    user_id: str
    title: str
    created_at: str
    updated_at: str
    message_count: int
    bytes: int
    next_seq: int


class MessageRow(NamedTuple):
    session_key: str
    seq: int
    id: str
    role: str
    content: str
    ts: str
    run_id: str | None
    name: str | None
    line_bytes: int


def copy_sessions(conn: psycopg.Connection[Any], rows: Iterable[SessionRow]) -> None:
    with conn.cursor() as cur, cur.copy(
            "COPY recalld_sessions (session_key, user_id, title, created_at, updated_at, "
            "message_count, bytes, next_seq) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


def copy_messages(conn: psycopg.Connection[Any], rows: Iterable[MessageRow]) -> None:
    with conn.cursor() as cur, cur.copy(
            "COPY recalld_messages (session_key, seq, id, role, content, ts, run_id, name, "
            "line_bytes) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)
