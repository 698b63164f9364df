"""The metadata index: one SQLite table that makes ``list`` fast.

Transcripts are the truth; this table is a cache of their headers plus ``updatedAt``,
``messageCount`` and the transcript size as last written. It lives in ``<data>/sessions.db``
(WAL) and is thrown away and rebuilt whenever it cannot be trusted:

* the file is missing, is not a database, or fails ``PRAGMA quick_check``;
* its ``schema_version`` is not this code's (a cache needs no migrations: rebuild instead);
* per row, when the transcript's size on disk differs from the recorded one, or a transcript
  exists that has no row (see :func:`sessions.reconcile.reconcile`).

This class is not thread-safe on its own; the store serialises every call with one lock.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

import apsw
import structlog

from .errors import UnsafePath
from .models import Session
from .transcript import Header, Summary

__all__ = ["SCHEMA_VERSION", "SessionIndex"]

log = structlog.get_logger(__name__)

SCHEMA_VERSION = "3"  # 2: the memory column; 3: temperature, max_tokens
_OPEN_FLAGS = apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE | apsw.SQLITE_OPEN_NOFOLLOW

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions(
    user          TEXT NOT NULL,
    session_key   TEXT NOT NULL,
    title         TEXT NOT NULL,
    created_at    TEXT NOT NULL,
    updated_at    TEXT NOT NULL,
    message_count INTEGER NOT NULL,
    system_prompt TEXT,
    model         TEXT,
    size          INTEGER NOT NULL,
    memory        INTEGER NOT NULL DEFAULT 1,
    temperature   REAL,
    max_tokens    INTEGER,
    PRIMARY KEY (user, session_key)
) WITHOUT ROWID;
-- list() walks this index from the newest end: one seek, then `limit` steps.
CREATE INDEX IF NOT EXISTS sessions_newest ON sessions(user, updated_at DESC, session_key DESC);
"""

_COLUMNS = ("session_key, user, title, created_at, updated_at, message_count, system_prompt, model,"
            " memory, temperature, max_tokens")
# Pages leave the system prompt out (up to max_line_bytes each, 200 to a page): a list must
# cost the same whatever the prompts hold; get() returns it.
_LIST_COLUMNS = _COLUMNS.replace("system_prompt", "NULL")

# The row-value comparison lets SQLite seek straight to the cursor inside `sessions_newest`
# (an equivalent OR expression only narrows by user and then scans from the newest row, so deep
# pages would cost O(offset)). apsw ships its own SQLite, so row values (3.15+) are always there.
_PAGE_SQL = f"""
SELECT {_LIST_COLUMNS} FROM sessions
WHERE user = ? AND (updated_at, session_key) < (?, ?)
ORDER BY updated_at DESC, session_key DESC
LIMIT ?
"""
_FIRST_PAGE_SQL = f"""
SELECT {_LIST_COLUMNS} FROM sessions
WHERE user = ?
ORDER BY updated_at DESC, session_key DESC
LIMIT ?
"""


def _int(value: object) -> int:
    if not isinstance(value, int):
        raise apsw.MismatchError(f"expected an integer column, got {type(value).__name__}")
    return value


def _session(row: tuple[object, ...]) -> Session:
    key, user, title, created, updated, count, prompt, model, memory, temperature, max_tokens = row
    return Session(
        session_key=str(key),
        user=str(user),
        title=str(title),
        created_at=str(created),
        updated_at=str(updated),
        message_count=_int(count),
        system_prompt=None if prompt is None else str(prompt),
        model=None if model is None else str(model),
        memory=bool(memory),
        temperature=float(temperature) if isinstance(temperature, int | float) else None,
        max_tokens=max_tokens if isinstance(max_tokens, int) else None,
    )


class SessionIndex:
    """``sessions.db``: open (resetting it if unusable), query, update."""

    def __init__(self, path: Path) -> None:
        self.path = path
        #: Why the index started empty this time ("missing", "corrupt", "schema"), or None.
        self.reset_reason: str | None = None
        if not path.exists():
            self.reset_reason = "missing"
        try:
            self._conn = self._connect()
            self._check()
        except apsw.Error as err:
            # Anything SQLite rejects here is a broken cache: remove it and start empty; the
            # store rebuilds the rows from the transcripts straight after.
            log.warning("sessions.index_reset", path=str(path), reason="corrupt", error=str(err))
            self.reset_reason = "corrupt"
            with contextlib.suppress(Exception):
                self._conn.close()
            self._remove_files()
            self._conn = self._connect()
            self._check()

    def _connect(self) -> apsw.Connection:
        # Titles and previews are chat text: the file (and so its -wal/-shm, which SQLite
        # creates with the database's mode) is 0600 from the start.
        # O_NOFOLLOW both times: a link planted as sessions.db is refused, never written through.
        try:
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o600))
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise UnsafePath("the session index (sessions.db)") from err
            raise
        conn = apsw.Connection(str(self.path), flags=_OPEN_FLAGS)
        conn.set_busy_timeout(5000)
        return conn

    def _check(self) -> None:
        conn = self._conn
        conn.execute("PRAGMA journal_mode=WAL")
        # The index is rebuildable, so a lost last commit after a power cut is acceptable.
        conn.execute("PRAGMA synchronous=NORMAL")
        result = conn.execute("PRAGMA quick_check").fetchall()
        if result != [("ok",)]:
            raise apsw.CorruptError(f"quick_check: {result[:3]!r}")
        has_meta = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
        ).fetchall()
        version = None
        if has_meta:
            rows = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall()
            version = rows[0][0] if rows else None
        if version != SCHEMA_VERSION:
            if version is not None:
                self.reset_reason = "schema"
            with conn:
                conn.execute("DROP TABLE IF EXISTS sessions; DROP TABLE IF EXISTS meta;")
                conn.execute(_SCHEMA)
                conn.execute(
                    "INSERT INTO meta(key, value) VALUES ('schema_version', ?)", (SCHEMA_VERSION,)
                )

    def _remove_files(self) -> None:
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(str(self.path) + suffix).unlink(missing_ok=True)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Group many writes into one commit (a rebuild of thousands of rows)."""
        with self._conn:
            yield

    def sizes(self, user: str | None = None) -> dict[tuple[str, str], int]:
        """``(user, session_key) -> recorded transcript size`` for every row (of ``user``)."""
        if user is None:
            rows = self._conn.execute("SELECT user, session_key, size FROM sessions")
        else:
            rows = self._conn.execute("SELECT user, session_key, size FROM sessions WHERE user = ?",
                                      (user,))
        return {(str(u), str(k)): _int(s) for u, k, s in rows}

    def get(self, user: str, session_key: str) -> tuple[Session, int] | None:
        rows = self._conn.execute(
            f"SELECT {_COLUMNS}, size FROM sessions WHERE user = ? AND session_key = ?",
            (user, session_key),
        ).fetchall()
        if not rows:
            return None
        return _session(rows[0][:-1]), _int(rows[0][-1])

    def page(self, user: str, after: tuple[str, str] | None, limit: int) -> list[Session]:
        """Up to ``limit`` sessions of ``user``, newest first, strictly past ``after``; their
        ``system_prompt`` is None (``get`` has it)."""
        if after is None:
            rows = self._conn.execute(_FIRST_PAGE_SQL, (user, limit))
        else:
            updated, key = after
            rows = self._conn.execute(_PAGE_SQL, (user, updated, key, limit))
        return [_session(row) for row in rows]

    def put(self, user: str, summary: Summary) -> None:
        """Insert or replace the row for one transcript from its summary."""
        h = summary.header
        self._conn.execute(
            "INSERT OR REPLACE INTO sessions(session_key, user, title, created_at, updated_at,"
            " message_count, system_prompt, model, size, memory, temperature, max_tokens)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                h.session_key, user, h.title, h.created_at, summary.updated_at,
                summary.message_count, h.system_prompt, h.model, summary.size, h.memory,
                h.temperature, h.max_tokens,
            ),
        )

    def record_append(self, user: str, session_key: str, updated_at: str, size: int) -> None:
        self._conn.execute(
            "UPDATE sessions SET updated_at = ?, message_count = message_count + 1, size = ?"
            " WHERE user = ? AND session_key = ?",
            (updated_at, size, user, session_key),
        )

    def record_update(self, user: str, session_key: str, header: Header, size: int) -> None:
        """An ``update`` line changed the header: neither ``updated_at`` nor the count moves."""
        self._conn.execute(
            "UPDATE sessions SET title = ?, system_prompt = ?, model = ?, temperature = ?,"
            " max_tokens = ?, size = ? WHERE user = ? AND session_key = ?",
            (header.title, header.system_prompt, header.model, header.temperature,
             header.max_tokens, size, user, session_key),
        )

    def record_size(self, user: str, session_key: str, size: int) -> None:
        """A line that is no message was appended (a conversation summary): only the size moves."""
        self._conn.execute(
            "UPDATE sessions SET size = ? WHERE user = ?"
            " AND session_key = ?", (size, user, session_key)
        )

    def delete(self, user: str, session_key: str) -> None:
        self._conn.execute(
            "DELETE FROM sessions WHERE user = ? AND session_key = ?", (user, session_key)
        )

    def idle(self, bound: str, limit: int, after: tuple[str, str]) -> list[tuple[str, str]]:
        """Up to ``limit`` ``(user, session_key)`` with ``updated_at < bound``, past ``after`` in
        primary-key order (:mod:`sessions.idle` makes the arguments)."""
        rows = self._conn.execute(
            "SELECT user, session_key FROM sessions WHERE updated_at < ?"
            " AND (user, session_key) > (?, ?) ORDER BY user, session_key LIMIT ?",
            (bound, after[0], after[1], limit),
        )
        return [(str(user), str(key)) for user, key in rows]

    def close(self) -> None:
        self._conn.close()
