"""Episodes and their queue in PostgreSQL: the SQLite episode store's methods
(:mod:`memory.sqlite.episodes`), on a psycopg connection (coroutines instead of blocking calls).

Each write is its own transaction (a savepoint inside the caller's). ``due`` claims jobs
with ``FOR UPDATE SKIP LOCKED``: call it inside a transaction and keep it open while the jobs
run, so two nodes never write the same summary.

``PgMemory.episodes`` is :class:`memory.episodes.Episodes` (embedding, novelty, the search's
ranking) over this store, each step awaited on a pooled connection. Its ``take_due`` claims
jobs for :data:`CLAIM_S` (it moves their ``next_ms`` on in the claiming transaction), so a job
runs on one node at a time though the claim's transaction has ended; a node that dies leaves
its jobs due again then.
"""

from __future__ import annotations

from array import array

from psycopg import AsyncConnection
from psycopg.rows import TupleRow

from memory.episodes.values import Episode, EpisodeDraft, EpisodeJob

__all__ = ["CLAIM_S", "PgEpisodeStore"]

# How long a claimed job is hidden from other nodes: longer than one summary takes (the chat
# model's reply) with room to spare; done or failed, the job's row says what comes next.
CLAIM_S = 600

Conn = AsyncConnection[TupleRow]

_COLUMNS = ("id, user_id, session_key, text, theme, day, week, year, created_ms, updated_ms, "
            "covered_ms, merges")


class PgEpisodeStore:
    """The same methods as the SQLite ``EpisodeStore``, awaited."""

    # -- rows ----------------------------------------------------------------------------

    async def insert(self, db: Conn, d: EpisodeDraft) -> Episode:
        c = d.columns()
        async with db.transaction():
            row = await (await db.execute(
                "INSERT INTO recalld_memory_episodes (user_id, session_key, text, theme, day, "
                "week, year, created_ms, updated_ms, covered_ms, vector, vector_model) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
                (d.user, d.session_key, c.text, c.theme, c.day, c.week, c.year, c.ms, c.ms,
                 c.covered_ms, c.vector, c.vector_model))).fetchone()
            if d.job_id is not None:
                await self.done(db, d.job_id)
        assert row is not None
        return await self.get(db, d.user, int(row[0]))

    async def merge(self, db: Conn, episode_id: int, d: EpisodeDraft) -> Episode:
        """Fold a new summary into an episode of the same theme (see the SQLite store)."""
        c = d.columns()
        async with db.transaction():
            await db.execute(
                "UPDATE recalld_memory_episodes SET text = %s, theme = %s, day = %s, week = %s, "
                "year = %s, updated_ms = %s, covered_ms = greatest(covered_ms, %s), "
                "merges = merges + 1, vector = %s, vector_model = %s WHERE id = %s "
                "AND user_id = %s",
                (c.text, c.theme, c.day, c.week, c.year, c.ms, c.covered_ms, c.vector,
                 c.vector_model, episode_id, d.user))
            if d.job_id is not None:
                await self.done(db, d.job_id)
        return await self.get(db, d.user, episode_id)

    async def get(self, db: Conn, user: str, episode_id: int) -> Episode:
        row = await (await db.execute(f"SELECT {_COLUMNS} FROM recalld_memory_episodes "
                                      "WHERE id = %s AND user_id = %s",
                                      (episode_id, user))).fetchone()
        if row is None:
            raise KeyError(episode_id)
        return Episode.from_row(row)

    async def page(self, db: Conn, user: str, *, limit: int, before: int | None) -> list[Episode]:
        rows = await (await db.execute(
            f"SELECT {_COLUMNS} FROM recalld_memory_episodes WHERE user_id = %s AND id < %s "
            "ORDER BY id DESC LIMIT %s",
            (user, before if before is not None else 1 << 62, limit))).fetchall()
        return [Episode.from_row(r) for r in rows]

    async def with_vectors(self, db: Conn, user: str, model: str | None,
                           limit: int) -> list[tuple[Episode, list[float] | None]]:
        """The user's newest ``limit`` episodes, each with its vector when ``model`` made it."""
        rows = await (await db.execute(
            f"SELECT {_COLUMNS}, vector, vector_model FROM recalld_memory_episodes "
            "WHERE user_id = %s ORDER BY updated_ms DESC LIMIT %s", (user, limit))).fetchall()
        return [(Episode.from_row(r), list(array("f", bytes(r[12]))) if r[12] is not None and model
                 and r[13] == model else None) for r in rows]

    async def last_of_session(self, db: Conn, user: str, session_key: str) -> Episode | None:
        row = await (await db.execute(
            f"SELECT {_COLUMNS} FROM recalld_memory_episodes WHERE user_id = %s "
            "AND session_key = %s ORDER BY covered_ms DESC LIMIT 1",
            (user, session_key))).fetchone()
        return Episode.from_row(row) if row else None

    async def count_since(self, db: Conn, user: str, since_ms: int) -> int:
        row = await (await db.execute(
            "SELECT count(*) FROM recalld_memory_episodes WHERE user_id = %s AND created_ms >= %s",
            (user, since_ms))).fetchone()
        return int(row[0]) if row else 0

    async def delete_older_than(self, db: Conn, cutoff_ms: int) -> int:
        async with db.transaction():
            cur = await db.execute("DELETE FROM recalld_memory_episodes WHERE updated_ms < %s",
                                   (cutoff_ms,))
        return cur.rowcount

    async def delete_for(self, db: Conn, user: str, session_key: str | None, after_ms: int | None,
                         before_ms: int | None) -> int:
        """memory.forget: episodes of the matching conversations (by what they cover)."""
        async with db.transaction():
            cur = await db.execute(
                "DELETE FROM recalld_memory_episodes WHERE user_id = %(user)s "
                "AND (%(key)s::text IS NULL OR session_key = %(key)s) "
                "AND (%(after)s::bigint IS NULL OR covered_ms >= %(after)s) "
                "AND (%(before)s::bigint IS NULL OR created_ms < %(before)s)",
                {"user": user, "key": session_key, "after": after_ms, "before": before_ms})
        return cur.rowcount

    # -- the queue -----------------------------------------------------------------------

    async def enqueue(self, db: Conn, user: str, session_key: str, now_ms: int) -> None:
        """Queue a summary of the session (one pending job per session: later turns join it)."""
        async with db.transaction():
            await db.execute(
                "INSERT INTO recalld_memory_episode_jobs (user_id, session_key, created_ms, "
                "next_ms) VALUES (%s, %s, %s, %s) ON CONFLICT (user_id, session_key) "
                "DO UPDATE SET failed = false, attempts = 0, "
                "next_ms = least(recalld_memory_episode_jobs.next_ms, excluded.next_ms)",
                (user, session_key, now_ms, now_ms))

    async def due(self, db: Conn, now_ms: int, limit: int = 20) -> list[EpisodeJob]:
        rows = await (await db.execute(
            "SELECT id, user_id, session_key, attempts FROM recalld_memory_episode_jobs "
            "WHERE NOT failed AND next_ms <= %s ORDER BY next_ms LIMIT %s FOR UPDATE SKIP LOCKED",
            (now_ms, limit))).fetchall()
        return [EpisodeJob(int(r[0]), str(r[1]), str(r[2]), int(r[3])) for r in rows]

    async def claim(self, db: Conn, now_ms: int, until_ms: int,
                    limit: int = 20) -> list[EpisodeJob]:
        """The due jobs no other node holds, each hidden from the others until ``until_ms``."""
        async with db.transaction():
            jobs = await self.due(db, now_ms, limit)
            await db.execute("UPDATE recalld_memory_episode_jobs SET next_ms = %s "
                             "WHERE id = ANY(%s)",
                             (until_ms, [j.id for j in jobs]))
        return jobs

    async def take_due(self, db: Conn, now_ms: int) -> list[EpisodeJob]:
        """The jobs this node runs now: claimed for :data:`CLAIM_S`."""
        return await self.claim(db, now_ms, now_ms + CLAIM_S * 1000)

    async def done(self, db: Conn, job_id: int) -> None:
        async with db.transaction():
            await db.execute("DELETE FROM recalld_memory_episode_jobs WHERE id = %s", (job_id,))

    async def failed_attempt(self, db: Conn, job_id: int, error: str, next_ms: int,
                             give_up: bool) -> None:
        async with db.transaction():
            await db.execute("UPDATE recalld_memory_episode_jobs SET attempts = attempts + 1, "
                             "last_error = %s, next_ms = %s, failed = %s WHERE id = %s",
                             (error[:500], next_ms, give_up, job_id))

    async def queue_state(self, db: Conn) -> dict[str, int]:
        row = await (await db.execute(
            "SELECT count(*) FILTER (WHERE NOT failed), count(*) FILTER (WHERE failed) "
            "FROM recalld_memory_episode_jobs")).fetchone()
        return ({"pending": int(row[0]), "failed": int(row[1])} if row
                else {"pending": 0, "failed": 0})
