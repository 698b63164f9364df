"""The ``episodes`` and ``episode_jobs`` tables: blocking reads and writes.

An episode is a dated 1–2 sentence summary of a stretch of one conversation. Writing one is
decided and done by the gateway (it owns the chat model); this module keeps the rows, the
durable queue of summaries still to write (a failed summary stays queued with its error and
its next try, until ``max_attempts``), and the numbers the rules need: when a session's last
episode was written, what it covered, and how many episodes a user got today.

The values (:class:`Episode`, :class:`EpisodeDraft`, :class:`EpisodeJob`) live in
:mod:`memory.episodes.values`, storage-neutral; they are re-exported here.
"""

from __future__ import annotations

from array import array

import apsw

from memory.episodes.values import Episode, EpisodeDraft, EpisodeJob

__all__ = ["EpisodeStore"]

_COLUMNS = ("id, user, session_key, text, theme, day, week, year, created_ms, updated_ms, "
            "covered_ms, merges")


class EpisodeStore:
    """Every method is blocking; writers hold the index's write lock."""

    # -- rows ----------------------------------------------------------------------------

    def insert(self, db: apsw.Connection, d: EpisodeDraft) -> Episode:
        c = d.columns()
        with db:
            db.execute(
                "INSERT INTO episodes(user, session_key, text, theme, day, week, year, created_ms, "
                "updated_ms, covered_ms, vector, vector_model) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (d.user, d.session_key, c.text, c.theme, c.day, c.week, c.year, c.ms, c.ms,
                 c.covered_ms, c.vector, c.vector_model))
            new_id = db.last_insert_rowid()
            if d.job_id is not None:
                self.done(db, d.job_id)
        return self.get(db, d.user, new_id)

    def merge(self, db: apsw.Connection, episode_id: int, d: EpisodeDraft) -> Episode:
        """Fold a new summary into an episode of the same theme: its text becomes the merged
        summary, it moves to now and covers up to the newest message."""
        c = d.columns()
        with db:
            db.execute(
                "UPDATE episodes SET text = ?, theme = ?, day = ?, week = ?, year = ?, "
                "updated_ms = ?, covered_ms = max(covered_ms, ?), merges = merges + 1, vector = ?, "
                "vector_model = ? WHERE id = ? AND user = ?",
                (c.text, c.theme, c.day, c.week, c.year, c.ms, c.covered_ms, c.vector,
                 c.vector_model, episode_id, d.user))
            if d.job_id is not None:
                self.done(db, d.job_id)
        return self.get(db, d.user, episode_id)

    def get(self, db: apsw.Connection, user: str, episode_id: int) -> Episode:
        row = db.execute(f"SELECT {_COLUMNS} FROM episodes WHERE id = ? AND user = ?",
                         (episode_id, user)).fetchone()
        if row is None:
            raise KeyError(episode_id)
        return Episode.from_row(row)

    def page(self, db: apsw.Connection, user: str, *, limit: int,
             before: int | None) -> list[Episode]:
        rows = db.execute(f"SELECT {_COLUMNS} FROM episodes WHERE user = ? AND id < ? "
                          "ORDER BY id DESC LIMIT ?",
                          (user, before if before is not None else 1 << 62, limit))
        return [Episode.from_row(r) for r in rows]

    def with_vectors(self, db: apsw.Connection, user: str, model: str | None,
                     limit: int) -> list[tuple[Episode, list[float] | None]]:
        """The user's newest ``limit`` episodes, each with its vector when ``model`` made it."""
        rows = db.execute(f"SELECT {_COLUMNS}, vector, vector_model FROM episodes WHERE user = ? "
                          "ORDER BY updated_ms DESC LIMIT ?", (user, limit))
        return [(Episode.from_row(r), list(array("f", bytes(r[12]))) if r[12] is not None and model
                 and r[13] == model else None) for r in rows]

    def last_of_session(self, db: apsw.Connection, user: str, session_key: str) -> Episode | None:
        row = db.execute(f"SELECT {_COLUMNS} FROM episodes WHERE user = ? AND session_key = ? "
                         "ORDER BY covered_ms DESC LIMIT 1", (user, session_key)).fetchone()
        return Episode.from_row(row) if row else None

    def count_since(self, db: apsw.Connection, user: str, since_ms: int) -> int:
        row = db.execute("SELECT count(*) FROM episodes WHERE user = ? AND created_ms >= ?",
                         (user, since_ms)).fetchone()
        return int(row[0]) if row else 0

    def delete_older_than(self, db: apsw.Connection, cutoff_ms: int) -> int:
        with db:
            db.execute("DELETE FROM episodes WHERE updated_ms < ?", (cutoff_ms,))
            removed = int(db.changes())
        return removed

    def delete_for(self, db: apsw.Connection, user: str, session_key: str | None,
                   after_ms: int | None, before_ms: int | None) -> int:
        """memory.forget: episodes of the matching conversations (by what they cover)."""
        with db:
            db.execute("DELETE FROM episodes WHERE user = ? AND (? IS NULL OR session_key = ?) "
                       "AND (? IS NULL OR covered_ms >= ?) AND (? IS NULL OR created_ms < ?)",
                       (user, session_key, session_key, after_ms, after_ms, before_ms, before_ms))
            removed = int(db.changes())
        return removed

    # -- the queue -----------------------------------------------------------------------

    def enqueue(self, db: apsw.Connection, user: str, session_key: str, now_ms: int) -> None:
        """Queue a summary of the session (one pending job per session: later turns join it)."""
        with db:
            db.execute("INSERT INTO episode_jobs(user, session_key, created_ms, next_ms) "
                       "VALUES (?, ?, ?, ?) ON CONFLICT(user, session_key) "
                       "DO UPDATE SET failed = 0, attempts = 0, "
                       "next_ms = min(next_ms, excluded.next_ms)",
                       (user, session_key, now_ms, now_ms))

    def take_due(self, db: apsw.Connection, now_ms: int) -> list[EpisodeJob]:
        """The jobs to run now: one node, so nothing to claim."""
        return self.due(db, now_ms)

    def due(self, db: apsw.Connection, now_ms: int, limit: int = 20) -> list[EpisodeJob]:
        rows = db.execute("SELECT id, user, session_key, attempts FROM episode_jobs "
                          "WHERE failed = 0 AND next_ms <= ? ORDER BY next_ms LIMIT ?",
                          (now_ms, limit))
        return [EpisodeJob(int(r[0]), str(r[1]), str(r[2]), int(r[3])) for r in rows]

    def done(self, db: apsw.Connection, job_id: int) -> None:
        with db:
            db.execute("DELETE FROM episode_jobs WHERE id = ?", (job_id,))

    def failed_attempt(self, db: apsw.Connection, job_id: int, error: str, next_ms: int,
                       give_up: bool) -> None:
        with db:
            db.execute("UPDATE episode_jobs SET attempts = attempts + 1, last_error = ?, "
                       "next_ms = ?, failed = ? WHERE id = ?",
                       (error[:500], next_ms, int(give_up), job_id))

    def queue_state(self, db: apsw.Connection) -> dict[str, int]:
        row = db.execute("SELECT coalesce(sum(failed = 0), 0), coalesce(sum(failed = 1), 0) "
                         "FROM episode_jobs").fetchone()
        return ({"pending": int(row[0]), "failed": int(row[1])} if row
                else {"pending": 0, "failed": 0})
