"""Remembered facts in PostgreSQL: the SQLite fact store's methods (:mod:`memory.sqlite.facts`),
on a psycopg connection (coroutines instead of blocking calls).

The rules are the SQLite store's (the module docstring of :mod:`memory.sqlite.facts`), from
the same :mod:`memory.facts.rules`: a change inserts the next version and retires the old one;
exact then semantic de-duplication decide in one transaction. That transaction first takes
``pg_advisory_xact_lock(FACTS_LOCK, hashtext(user))``: SQLite's single writer kept two runs from
racing a user's dedup; across nodes the lock does, per user.

:class:`memory.facts.Facts` (embedding, dedup, the prompt's ranking) runs over this store with
each step awaited on a pooled connection (:class:`memory.pg.steps.PoolSteps`): what
``PgMemory.facts`` hands the gateway.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import TupleRow

from memory.errors import FactNotFound
from memory.facts.rules import (
    FactRules,
    check_replaceable,
    now_stamps,
    saved,
    text_hash,
    vector_blob,
    with_vectors,
)
from memory.facts.values import Fact, FactChange, FactDraft

__all__ = ["FACTS_LOCK", "PgFactStore"]

FACTS_LOCK = 0x72636C66

Conn = AsyncConnection[TupleRow]

_COLUMNS = ("id, user_id, text, active, previous_id, origin_id, source, session_key, run_id, "
            "created_at, updated_at, client")


class PgFactStore(FactRules):
    """Facts on an async psycopg connection; the same methods as the SQLite ``FactStore``."""

    # -- reads ---------------------------------------------------------------------------

    async def get(self, db: Conn, user: str, fact_id: int) -> Fact:
        row = await (await db.execute(f"SELECT {_COLUMNS} FROM recalld_memory_facts WHERE id = %s "
                                      "AND user_id = %s",
                                      (fact_id, user))).fetchone()
        if row is None:
            raise FactNotFound(f"fact {fact_id} not found")
        return Fact.from_row(row)

    async def page(self, db: Conn, user: str, *, limit: int, before: int | None = None,
                   include_inactive: bool = False) -> list[Fact]:
        """Newest first; ``before`` is the id of the last fact of the previous page."""
        rows = await (await db.execute(
            f"SELECT {_COLUMNS} FROM recalld_memory_facts WHERE user_id = %s AND (%s OR active) "
            "AND id < %s ORDER BY id DESC LIMIT %s",
            (user, include_inactive, before if before is not None else 1 << 62, limit))).fetchall()
        return [Fact.from_row(r) for r in rows]

    async def history(self, db: Conn, user: str, fact_id: int) -> list[Fact]:
        """Every version of the fact ``fact_id`` belongs to, oldest first."""
        fact = await self.get(db, user, fact_id)
        rows = await (await db.execute(
            f"SELECT {_COLUMNS} FROM recalld_memory_facts WHERE user_id = %s "
            "AND (id = %s OR origin_id = %s) ORDER BY id",
            (user, fact.origin_id, fact.origin_id))).fetchall()
        return [Fact.from_row(r) for r in rows]

    async def active_with_vectors(self, db: Conn, user: str, vector_model: str | None
                                  ) -> list[tuple[Fact, list[float] | None]]:
        """The user's active facts, each with its vector when it was made by ``vector_model``."""
        rows = await (await db.execute(
            f"SELECT {_COLUMNS}, vector, vector_model FROM recalld_memory_facts WHERE user_id = %s "
            "AND active ORDER BY id", (user,))).fetchall()
        return with_vectors(rows, vector_model)

    # -- writes --------------------------------------------------------------------------

    async def save(self, db: Conn, draft: FactDraft) -> FactChange:
        """Insert, merge or replace, in one transaction under the user's lock."""
        text = self.check_text(draft.text)
        digest = text_hash(text)
        similarity: float | None = None
        async with db.transaction():
            await db.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                             (FACTS_LOCK, draft.user))
            replaced: Fact | None = None
            if draft.replaces is not None:
                replaced = check_replaceable(await self.get(db, draft.user, draft.replaces))
            same = await (await db.execute(
                f"SELECT {_COLUMNS} FROM recalld_memory_facts WHERE user_id = %s "
                "AND text_hash = %s AND active",
                (draft.user, digest))).fetchone()
            if same is not None:
                fact = Fact.from_row(same)
                if replaced is not None and replaced.id != fact.id:
                    await self._retire(db, replaced.id)
                return FactChange("unchanged", await self._touch(db, fact))
            if replaced is None and draft.vector is not None:
                replaced, similarity = await self._closest(db, draft)
            if replaced is None:
                count = await (await db.execute(
                    "SELECT count(*) FROM recalld_memory_facts WHERE user_id = %s AND active",
                    (draft.user,))).fetchone()
                self.check_room(int(count[0]) if count is not None else 0)
            new = await self._insert(db, draft, text, digest, replaced)
        return saved(new, replaced, similarity)

    async def delete(self, db: Conn, user: str, fact_id: int) -> FactChange:
        """Remove the fact and every earlier version of it."""
        async with db.transaction():
            fact = await self.get(db, user, fact_id)
            await db.execute("DELETE FROM recalld_memory_facts WHERE user_id = %s "
                             "AND (id = %s OR origin_id = %s)",
                             (user, fact.origin_id, fact.origin_id))
        return FactChange("deleted", fact)

    async def delete_derived(self, db: Conn, user: str, session_key: str | None,
                             after_ms: int | None, before_ms: int | None) -> int:
        """Every fact (all versions) any of whose versions the model saved from the matching
        conversation: memory.forget's "facts derived from them"."""
        params: dict[str, Any] = {"user": user, "session_key": session_key, "after": after_ms,
                                  "before": before_ms}
        async with db.transaction():
            origins = [int(r[0]) for r in await (await db.execute(
                "SELECT DISTINCT coalesce(origin_id, id) FROM recalld_memory_facts "
                "WHERE user_id = %(user)s AND source = 'model' "
                "AND (%(session_key)s::text IS NULL OR session_key = %(session_key)s) "
                "AND (%(after)s::bigint IS NULL OR said_ms >= %(after)s) "
                "AND (%(before)s::bigint IS NULL OR said_ms < %(before)s)", params)).fetchall()]
            await db.execute("DELETE FROM recalld_memory_facts WHERE user_id = %s "
                             "AND coalesce(origin_id, id) = ANY(%s)", (user, origins))
        return len(origins)

    async def delete_older_than(self, db: Conn, cutoff_ms: int) -> int:
        """Retention: facts whose newest version is older than the cutoff, all versions."""
        async with db.transaction():
            origins = [int(r[0]) for r in await (await db.execute(
                "SELECT coalesce(origin_id, id) FROM recalld_memory_facts WHERE active "
                "AND said_ms < %s",
                (cutoff_ms,))).fetchall()]
            await db.execute("DELETE FROM recalld_memory_facts "
                             "WHERE coalesce(origin_id, id) = ANY(%s)", (origins,))
        return len(origins)

    async def store_vectors(self, db: Conn, rows: Sequence[tuple[int, Sequence[float]]],
                            model: str) -> None:
        async with db.transaction(), db.cursor() as cur:
            await cur.executemany("UPDATE recalld_memory_facts SET vector = %s, vector_model = %s "
                                  "WHERE id = %s",
                                  [(vector_blob(vec), model, fact_id) for fact_id, vec in rows])

    async def _closest(self, db: Conn, draft: FactDraft) -> tuple[Fact | None, float | None]:
        assert draft.vector is not None
        return self.closest(draft.vector,
                            await self.active_with_vectors(db, draft.user, draft.vector_model))

    async def _insert(self, db: Conn, draft: FactDraft, text: str, digest: str,
                      replaced: Fact | None) -> Fact:
        stamp, ms = now_stamps()
        if replaced is not None:
            await self._retire(db, replaced.id)
        origin = replaced.origin_id if replaced is not None else None
        row = await (await db.execute(
            "INSERT INTO recalld_memory_facts (user_id, text, text_hash, active, previous_id, "
            "origin_id, source, session_key, run_id, created_at, updated_at, said_ms, vector, "
            "vector_model, client) VALUES (%s, %s, %s, true, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
            "%s, %s) RETURNING id",
            (draft.user, text, digest, replaced.id if replaced else None, origin, draft.source,
             draft.session_key, draft.run_id, stamp, stamp, ms, vector_blob(draft.vector),
             draft.vector_model if draft.vector is not None else None, draft.client))).fetchone()
        assert row is not None
        return await self.get(db, draft.user, int(row[0]))

    async def _retire(self, db: Conn, fact_id: int) -> None:
        stamp, _ = now_stamps()
        await db.execute("UPDATE recalld_memory_facts SET active = false, updated_at = %s "
                         "WHERE id = %s",
                         (stamp, fact_id))

    async def _touch(self, db: Conn, fact: Fact) -> Fact:
        stamp, ms = now_stamps()
        await db.execute("UPDATE recalld_memory_facts SET updated_at = %s, said_ms = %s "
                         "WHERE id = %s",
                         (stamp, ms, fact.id))
        return await self.get(db, fact.user, fact.id)
