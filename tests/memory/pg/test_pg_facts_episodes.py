"""Facts and episodes in PostgreSQL keep the SQLite stores' rules, and hold across nodes."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from psycopg import AsyncConnection
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from memory.episodes.values import EpisodeDraft
from memory.errors import FactNotFound, InvalidFact
from memory.facts.values import FactDraft
from memory.pg.episodes import PgEpisodeStore
from memory.pg.facts import PgFactStore

Pool = AsyncConnectionPool[AsyncConnection[TupleRow]]


def store() -> PgFactStore:
    return PgFactStore(dedup_threshold=0.92, max_chars=200, max_per_user=3)


async def test_fact_versions_dedup_and_delete(pool: Pool) -> None:
    """Exact repeats are one fact, a close vector updates it, a replacement retires the old
    version, history shows every version, and delete removes them all."""
    facts = store()
    async with pool.connection() as db:
        first = await facts.save(db, FactDraft("alice", "Luna is 3.", "model", vector=[1.0, 0.0],
                                               vector_model="m"))
        assert first.action == "added"
        again = await facts.save(db, FactDraft("alice", "luna  is 3", "user"))
        assert (again.action, again.fact.id) == ("unchanged", first.fact.id)
        close = await facts.save(db, FactDraft("alice", "Luna is three", "model",
                                               vector=[0.99, 0.05], vector_model="m"))
        assert close.action == "updated" and close.previous_id == first.fact.id
        fixed = await facts.save(db, FactDraft("alice", "Luna is 4", "user",
                                               replaces=close.fact.id))
        assert fixed.action == "replaced"
        with pytest.raises(InvalidFact):
            await facts.save(db, FactDraft("alice", "Luna is 5", "user", replaces=close.fact.id))
        history = await facts.history(db, "alice", fixed.fact.id)
        assert [f.text for f in history] == ["Luna is 3.", "Luna is three", "Luna is 4"]
        assert [f.text for f in await facts.page(db, "alice", limit=10)] == ["Luna is 4"]
        assert await facts.page(db, "bob", limit=10) == []
        await facts.delete(db, "alice", fixed.fact.id)
        assert await facts.page(db, "alice", limit=10, include_inactive=True) == []
        with pytest.raises(FactNotFound):
            await facts.get(db, "alice", fixed.fact.id)


async def test_two_nodes_saving_one_fact_together_make_one(pool: Pool) -> None:
    """The same fact saved at once through two connections (two nodes) is stored once: the
    per-user lock serialises the dedup decision."""
    facts = store()

    async def save(text: str) -> str:
        async with pool.connection() as db:
            return (await facts.save(db, FactDraft("alice", text, "model"))).action

    actions = await asyncio.gather(*(save("Prefers tea over coffee") for _ in range(4)))
    assert sorted(actions) == ["added", "unchanged", "unchanged", "unchanged"]
    async with pool.connection() as db:
        assert len(await facts.page(db, "alice", limit=10)) == 1


async def test_episodes_and_their_queue(pool: Pool) -> None:
    """Episodes insert, merge and page as in SQLite; a queued job is claimed by one node only,
    and a failed attempt is counted."""
    episodes = PgEpisodeStore()
    moment = datetime(2026, 11, 22, 10, tzinfo=UTC)
    async with pool.connection() as db:
        first = await episodes.insert(db, EpisodeDraft("alice", "k1", "Planned the garden.",
                                                       "garden", moment, 1000))
        merged = await episodes.merge(db, first.id, EpisodeDraft("alice", "k1",
                                                                 "Planned and planted the garden.",
                                                                 "garden", moment, 2000))
        assert (merged.merges, merged.covered_ms, merged.week) == (1, 2000, "2026-W47")
        assert [e.id for e in await episodes.page(db, "alice", limit=5, before=None)] == [first.id]
        assert (await episodes.last_of_session(db, "alice", "k1")) == merged
        await episodes.enqueue(db, "alice", "k1", 5)
        await episodes.enqueue(db, "alice", "k1", 9)
        assert await episodes.queue_state(db) == {"pending": 1, "failed": 0}
    async with pool.connection() as a, pool.connection() as b, a.transaction(), b.transaction():
        claimed = await episodes.due(a, 10)
        assert [j.session_key for j in claimed] == ["k1"]
        assert await episodes.due(b, 10) == []  # locked by the other node's claim
        await episodes.failed_attempt(a, claimed[0].id, "upstream 503", 20, give_up=True)
    async with pool.connection() as db:
        assert await episodes.queue_state(db) == {"pending": 0, "failed": 1}
        assert await episodes.delete_for(db, "alice", "k1", None, None) == 1
