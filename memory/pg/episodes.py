"""Episodes and their queue in PostgreSQL: :class:`memory.episodes.store.EpisodeStore`'s
methods, on a psycopg connection (coroutines instead of blocking calls).

Each write is its own transaction (a savepoint inside the caller's). ``due`` claims jobs
with ``FOR UPDATE SKIP LOCKED``: call it inside a transaction and keep it open while the jobs
run, so two nodes never write the same summary.

:class:`PgEpisodes` is :class:`memory.episodes.Episodes` (embedding, novelty, the search's
ranking) with each store step awaited on a pooled connection: what ``PgMemory.episodes``
hands the gateway and the episode writer. Its ``due`` claims jobs for :data:`CLAIM_S` (it
moves their ``next_ms`` on in the claiming transaction), so a job runs on one node at a time
though the claim's transaction has ended; a node that dies leaves its jobs due again then.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

from psycopg import AsyncConnection
from psycopg.rows import TupleRow

from memory.embedders.embeddings import EmbeddingPipeline
from memory.episodes.service import Episodes
from memory.episodes.store import dated
from memory.episodes.values import Episode, EpisodeDraft, EpisodeJob
from memory.pg.steps import Pool, pooled_step

__all__ = ["CLAIM_S", "PgEpisodeStore", "PgEpisodes"]

# How long a claimed job is hidden from other nodes: longer than one summary takes (the chat
# model's reply) with room to spare; done or failed, the job's row says what comes next.
CLAIM_S = 600

Conn = AsyncConnection[TupleRow]

_COLUMNS = "id, user_id, session_key, text, theme, day, week, year, created_ms, updated_ms, covered_ms, merges"


def _blob(vector: Sequence[float] | None) -> bytes | None:
    return None if vector is None else array("f", vector).tobytes()


class PgEpisodeStore:
    """The same methods as the SQLite ``EpisodeStore``, awaited."""

    # -- rows ----------------------------------------------------------------------------

    async def insert(self, db: Conn, d: EpisodeDraft) -> Episode:
        day, week, year = dated(d.moment)
        ms = int(d.moment.timestamp() * 1000)
        async with db.transaction():
            row = await (await db.execute(
                "INSERT INTO recalld_memory_episodes (user_id, session_key, text, theme, day, week, year, created_ms, "
                "updated_ms, covered_ms, vector, vector_model) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
                "RETURNING id",
                (d.user, d.session_key, d.text, d.theme, day, week, year, ms, ms, d.covered_ms, _blob(d.vector),
                 d.vector_model if d.vector is not None else None))).fetchone()
            if d.job_id is not None:
                await self.done(db, d.job_id)
        assert row is not None
        return await self.get(db, d.user, int(row[0]))

    async def merge(self, db: Conn, episode_id: int, d: EpisodeDraft) -> Episode:
        """Fold a new summary into an episode of the same theme (see the SQLite store)."""
        day, week, year = dated(d.moment)
        ms = int(d.moment.timestamp() * 1000)
        async with db.transaction():
            await db.execute(
                "UPDATE recalld_memory_episodes SET text = %s, theme = %s, day = %s, week = %s, year = %s, "
                "updated_ms = %s, covered_ms = greatest(covered_ms, %s), merges = merges + 1, vector = %s, "
                "vector_model = %s WHERE id = %s AND user_id = %s",
                (d.text, d.theme, day, week, year, ms, d.covered_ms, _blob(d.vector),
                 d.vector_model if d.vector is not None else None, episode_id, d.user))
            if d.job_id is not None:
                await self.done(db, d.job_id)
        return await self.get(db, d.user, episode_id)

    async def get(self, db: Conn, user: str, episode_id: int) -> Episode:
        row = await (await db.execute(f"SELECT {_COLUMNS} FROM recalld_memory_episodes WHERE id = %s AND user_id = %s",
                                      (episode_id, user))).fetchone()
        if row is None:
            raise KeyError(episode_id)
        return Episode.from_row(row)

    async def page(self, db: Conn, user: str, *, limit: int, before: int | None) -> list[Episode]:
        rows = await (await db.execute(
            f"SELECT {_COLUMNS} FROM recalld_memory_episodes WHERE user_id = %s AND id < %s ORDER BY id DESC LIMIT %s",
            (user, before if before is not None else 1 << 62, limit))).fetchall()
        return [Episode.from_row(r) for r in rows]

    async def with_vectors(self, db: Conn, user: str, model: str | None,
                           limit: int) -> list[tuple[Episode, list[float] | None]]:
        """The user's newest ``limit`` episodes, each with its vector when ``model`` made it."""
        rows = await (await db.execute(
            f"SELECT {_COLUMNS}, vector, vector_model FROM recalld_memory_episodes WHERE user_id = %s "
            "ORDER BY updated_ms DESC LIMIT %s", (user, limit))).fetchall()
        return [(Episode.from_row(r), list(array("f", bytes(r[12]))) if r[12] is not None and model
                 and r[13] == model else None) for r in rows]

    async def last_of_session(self, db: Conn, user: str, session_key: str) -> Episode | None:
        row = await (await db.execute(
            f"SELECT {_COLUMNS} FROM recalld_memory_episodes WHERE user_id = %s AND session_key = %s "
            "ORDER BY covered_ms DESC LIMIT 1", (user, session_key))).fetchone()
        return Episode.from_row(row) if row else None

    async def count_since(self, db: Conn, user: str, since_ms: int) -> int:
        row = await (await db.execute(
            "SELECT count(*) FROM recalld_memory_episodes WHERE user_id = %s AND created_ms >= %s",
            (user, since_ms))).fetchone()
        return int(row[0]) if row else 0

    async def delete_older_than(self, db: Conn, cutoff_ms: int) -> int:
        async with db.transaction():
            cur = await db.execute("DELETE FROM recalld_memory_episodes WHERE updated_ms < %s", (cutoff_ms,))
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
                "INSERT INTO recalld_memory_episode_jobs (user_id, session_key, created_ms, next_ms) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT (user_id, session_key) DO UPDATE SET failed = false, "
                "attempts = 0, next_ms = least(recalld_memory_episode_jobs.next_ms, excluded.next_ms)",
                (user, session_key, now_ms, now_ms))

    async def due(self, db: Conn, now_ms: int, limit: int = 20) -> list[EpisodeJob]:
        rows = await (await db.execute(
            "SELECT id, user_id, session_key, attempts FROM recalld_memory_episode_jobs WHERE NOT failed "
            "AND next_ms <= %s ORDER BY next_ms LIMIT %s FOR UPDATE SKIP LOCKED", (now_ms, limit))).fetchall()
        return [EpisodeJob(int(r[0]), str(r[1]), str(r[2]), int(r[3])) for r in rows]

    async def claim(self, db: Conn, now_ms: int, until_ms: int, limit: int = 20) -> list[EpisodeJob]:
        """The due jobs no other node holds, each hidden from the others until ``until_ms``."""
        async with db.transaction():
            jobs = await self.due(db, now_ms, limit)
            await db.execute("UPDATE recalld_memory_episode_jobs SET next_ms = %s WHERE id = ANY(%s)",
                             (until_ms, [j.id for j in jobs]))
        return jobs

    async def done(self, db: Conn, job_id: int) -> None:
        async with db.transaction():
            await db.execute("DELETE FROM recalld_memory_episode_jobs WHERE id = %s", (job_id,))

    async def failed_attempt(self, db: Conn, job_id: int, error: str, next_ms: int, give_up: bool) -> None:
        async with db.transaction():
            await db.execute("UPDATE recalld_memory_episode_jobs SET attempts = attempts + 1, last_error = %s, "
                             "next_ms = %s, failed = %s WHERE id = %s", (error[:500], next_ms, give_up, job_id))

    async def queue_state(self, db: Conn) -> dict[str, int]:
        row = await (await db.execute(
            "SELECT count(*) FILTER (WHERE NOT failed), count(*) FILTER (WHERE failed) "
            "FROM recalld_memory_episode_jobs")).fetchone()
        return {"pending": int(row[0]), "failed": int(row[1])} if row else {"pending": 0, "failed": 0}


class PgEpisodes(Episodes):
    """:class:`memory.episodes.Episodes` over a pool: the same rules, each step on a pooled connection."""

    store: PgEpisodeStore  # type: ignore[assignment]  # the same methods as EpisodeStore's, awaited

    def __init__(self, pool: Pool, pipeline: EmbeddingPipeline | None,
                 embed_query: Callable[[str], Awaitable[list[float]]], keyword_weight: float) -> None:
        # No SQLite connection or readers: _write and _read below are the only ones that used them.
        super().__init__(cast(Any, None), cast(Any, None), pipeline, embed_query, keyword_weight)
        self.store = PgEpisodeStore()
        self._pool = pool

    async def due(self) -> list[EpisodeJob]:
        now_ms = int(time.time() * 1000)
        jobs: list[EpisodeJob] = await self._write("claiming episode jobs", self.store.claim, now_ms,
                                                   now_ms + CLAIM_S * 1000)
        return jobs

    async def _write(self, action: str, fn: Callable[..., Any], *args: object, grows: bool = False) -> Any:
        # ``grows`` is not checked here: the disk is the database server's (sessions.md).
        return await pooled_step(self._pool, action, fn, *args)

    async def _read(self, fn: Callable[..., Any]) -> Any:
        return await pooled_step(self._pool, "reading episodes", fn)
