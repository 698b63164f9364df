"""The run lease: one holder per session across nodes, a larger fencing token for each new
holder, an expired lease taken over with what its run had checkpointed, and a transcript
append that carries a stale token refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from gateway.cluster import CHANNEL, RunLeases, migrate
from sessions import RUN_FENCE, LeaseLost, PgSessionStore, RunFence

_Pool = AsyncConnectionPool[psycopg.AsyncConnection[tuple[Any, ...]]]


@pytest.fixture
async def pool(pg_dsn: str) -> AsyncIterator[_Pool]:
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        await migrate(conn)
    async with AsyncConnectionPool(pg_dsn, min_size=1, max_size=4, open=False) as p:
        yield p


async def _expire(pool: _Pool, session_key: str) -> None:
    """As if the holder's node had stopped renewing a TTL ago."""
    async with pool.connection() as conn:
        await conn.execute("UPDATE recalld_run_leases SET expires_at = now() - interval '1 second'"
                           " WHERE session_key = %s", (session_key,))


async def test_one_holder_at_a_time_and_each_new_holder_a_larger_token(pool: _Pool) -> None:
    """While A holds a session's lease B cannot take it (another session it can); once A lets
    it go B takes it with a larger token."""
    a = RunLeases(pool, node_id="A", ttl_s=30, channel=CHANNEL)
    b = RunLeases(pool, node_id="B", ttl_s=30, channel=CHANNEL)
    key = "5f0c" + "0" * 28
    first = await a.take("alice", key, "r1")
    assert first is not None and first.orphan is None
    assert await b.take("alice", key, "r2") is None
    assert await b.take("alice", "f" * 32, "r3") is not None
    await a.release(key, first.token, "r1")
    second = await b.take("alice", key, "r2")
    assert second is not None and second.token > first.token and second.orphan is None


async def test_an_expired_lease_is_taken_over_with_its_checkpoint(pool: _Pool) -> None:
    """A lease that is renewed stays; once it expires, another node takes it and learns the
    run it ends and the partial its node checkpointed; the old holder can no longer renew it."""
    a = RunLeases(pool, node_id="A", ttl_s=30, channel=CHANNEL)
    b = RunLeases(pool, node_id="B", ttl_s=30, channel=CHANNEL)
    key = "a" * 32
    taken = await a.take("alice", key, "r1")
    assert taken is not None
    assert await a.renew(["r1"], [(taken.token, "Once upon")]) == {taken.token}
    assert await b.take("alice", key, "r2") is None
    await _expire(pool, key)
    over = await b.take("alice", key, "r2")
    assert over is not None and over.token > taken.token
    assert over.orphan is not None
    assert (over.orphan.run_id, over.orphan.user, over.orphan.partial) == (
        "r1", "alice", "Once upon")
    assert await a.renew(["r1"], [(taken.token, "Once upon a time")]) == set()


async def test_an_append_with_a_stale_token_is_refused(pool: _Pool, pg_dsn: str) -> None:
    """The transcript append of a run whose lease was taken over (a stale token) writes
    nothing and raises LeaseLost; the new holder's append goes in; an append with no fence is
    not checked."""
    store = PgSessionStore(pg_dsn)
    try:
        key = store.create("alice").session_key
        old = RunLeases(pool, node_id="A", ttl_s=30, channel=CHANNEL)
        new = RunLeases(pool, node_id="B", ttl_s=30, channel=CHANNEL)
        stale = await old.take("alice", key, "r1")
        assert stale is not None
        await _expire(pool, key)
        fresh = await new.take("alice", key, "r2")
        assert fresh is not None

        def append(fence: RunFence | None, text: str) -> None:
            RUN_FENCE.set(fence)
            store.append_message("alice", key, role="assistant", content=text, run_id="r1")

        stale_fence = RunFence(key, stale.token)
        with pytest.raises(LeaseLost):
            await asyncio.to_thread(append, stale_fence, "from the old holder")
        assert stale_fence.lost
        await asyncio.to_thread(append, RunFence(key, fresh.token), "from the new holder")
        await asyncio.to_thread(append, None, "no run")
        contents = [m.content for m in store.recent_messages("alice", key, 10)]
        assert contents == ["from the new holder", "no run"]
    finally:
        store.close()


async def test_runs_are_live_while_renewed(pool: _Pool) -> None:
    """A registered run is live to every node while its node renews it, and dead once not."""
    a = RunLeases(pool, node_id="A", ttl_s=30, channel=CHANNEL)
    b = RunLeases(pool, node_id="B", ttl_s=30, channel=CHANNEL)
    await a.register("alice", "a" * 32, "r1")
    assert await b.live_runs(["r1", "r2"]) == {"r1"}
    async with pool.connection() as conn:
        await conn.execute("UPDATE recalld_runs SET expires_at = now() - interval '1 second'")
    assert await b.live_runs(["r1"]) == set()
    assert await b.dead_run_sessions(10) == [("alice", "a" * 32)]
    await a.renew(["r1"], [])
    assert await b.live_runs(["r1"]) == {"r1"}
