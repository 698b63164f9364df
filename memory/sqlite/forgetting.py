"""What the index must not hold: chunks past ``memory.retention_days`` and what the user forgot.

Both rules are applied in two places, so neither a sweep nor a sync can miss them:

- whenever :class:`~memory.sqlite.index.sync.FileSync` writes a transcript's chunks (a new file, an
  append, a full reindex), it then drops that file's chunks that fall under a rule — so a
  reindex never brings forgotten or expired text back, even for a moment longer than the
  write transaction;
- the daily retention sweep and ``memory.forget`` drop every matching chunk at once, for files
  no sync would touch.

A forget that purges the transcript records nothing here: the messages are gone from the file,
so no sync can find them. One that keeps the transcript records its range in ``forgotten``.
A chunk is dropped when it *overlaps* a forgotten range (it may hold a message outside the
range too: forgetting errs on the side of forgetting), and when its *newest* message is older
than the retention cutoff. Functions here are blocking; callers hold the write lock.
:class:`ForgetRange` lives in :mod:`memory.forget_range`; it is re-exported here.
"""

from __future__ import annotations

from datetime import UTC, datetime

import apsw

from memory.forget_range import ForgetRange, retention_cutoff_ms

__all__ = ["ForgetRange", "chunk_ids_for_file", "matching_chunk_ids", "old_chunk_ids",
           "record_forgotten", "retention_cutoff_ms"]

def record_forgotten(db: apsw.Connection, r: ForgetRange) -> None:
    db.execute("INSERT INTO forgotten(user, session_key, after_ms, before_ms, created_at) "
               "VALUES (?, ?, ?, ?, ?)",
               (r.user, r.session_key, r.after_ms, r.before_ms, datetime.now(UTC).isoformat()))


def matching_chunk_ids(db: apsw.Connection, r: ForgetRange, path: str | None = None) -> list[int]:
    """Chunks of ``r.user`` (in ``path`` when given) overlapping the range."""
    return [int(row[0]) for row in db.execute(
        "SELECT id FROM chunks WHERE user = ? AND (? IS NULL OR session_key = ?) "
        "AND (? IS NULL OR path = ?) AND (? IS NULL OR coalesce(end_ms, start_ms) >= ?) "
        "AND (? IS NULL OR start_ms < ?)",
        (r.user, r.session_key, r.session_key, path, path, r.after_ms, r.after_ms, r.before_ms,
         r.before_ms))]


def old_chunk_ids(db: apsw.Connection, cutoff_ms: int, path: str | None = None) -> list[int]:
    return [int(row[0]) for row in db.execute(
        "SELECT id FROM chunks WHERE end_ms < ? AND (? IS NULL OR path = ?)",
        (cutoff_ms, path, path))]


def chunk_ids_for_file(db: apsw.Connection, path: str, user: str, session_key: str,
                       cutoff_ms: int | None) -> list[int]:
    """The chunks of one transcript that must go: expired, or under a recorded forget."""
    ids: set[int] = set(old_chunk_ids(db, cutoff_ms, path)) if cutoff_ms is not None else set()
    rows = list(db.execute(
        "SELECT after_ms, before_ms FROM forgotten WHERE user = ? "
        "AND (session_key IS NULL OR session_key = ?)",
        (user, session_key)))
    for after_ms, before_ms in rows:
        ids.update(matching_chunk_ids(db, ForgetRange(user, session_key, after_ms, before_ms),
                                      path))
    return sorted(ids)
