"""Idempotency keys in the database: the first claim wins on every node, an expired key is
taken over, a released key is free again, and the tables migrate once under concurrency."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from gateway.cluster import MIGRATIONS, IdempotencyKeys, migrate


async def _migrated(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await migrate(conn)


@pytest.fixture
async def two_nodes(pg_dsn: str) -> AsyncIterator[tuple[IdempotencyKeys, IdempotencyKeys]]:
    await _migrated(pg_dsn)
    async with AsyncConnectionPool(pg_dsn, min_size=1, max_size=4, open=False) as p1, \
            AsyncConnectionPool(pg_dsn, min_size=1, max_size=4, open=False) as p2:
        yield IdempotencyKeys(p1), IdempotencyKeys(p2)


async def test_the_first_claim_wins_on_every_node(
    two_nodes: tuple[IdempotencyKeys, IdempotencyKeys]
) -> None:
    """Twelve sends with one key through two nodes at once: all answer one run id, which is
    one of theirs, and a later retry answers it too."""
    a, b = two_nodes
    claims = [(a if i % 2 else b).claim("alice", "k" * 32, "idem-1", f"run{i}", 300)
              for i in range(12)]
    winners = set(await asyncio.gather(*claims))
    assert len(winners) == 1 and winners <= {f"run{i}" for i in range(12)}
    assert await b.claim("alice", "k" * 32, "idem-1", "late", 300) == winners.pop()
    assert await a.claim("bob", "k" * 32, "idem-1", "bobs", 300) == "bobs"  # keys are per user


async def test_an_expired_key_is_taken_over_and_a_released_one_is_free(
    two_nodes: tuple[IdempotencyKeys, IdempotencyKeys],
) -> None:
    """A claim whose time is up no longer answers retries; release frees a live claim only
    for the run that owns it."""
    a, b = two_nodes
    assert await a.claim("alice", "k" * 32, "gone", "old", 0) == "old"
    assert await b.claim("alice", "k" * 32, "gone", "new", 300) == "new"
    await a.release("alice", "k" * 32, "gone", "old")  # not the owner: nothing changes
    assert await a.claim("alice", "k" * 32, "gone", "other", 300) == "new"
    await b.release("alice", "k" * 32, "gone", "new")
    assert await a.claim("alice", "k" * 32, "gone", "retry", 300) == "retry"
    assert await a.claim("alice", "k" * 32, "short", "s", 0) == "s"
    assert await b.sweep() == 1


async def test_nodes_migrating_at_once_apply_each_migration_once(pg_dsn: str) -> None:
    """Eight connections migrating one empty database together all succeed; each migration
    is recorded once."""
    await asyncio.gather(*(_migrated(pg_dsn) for _ in range(8)))
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        cur = await conn.execute("SELECT name FROM recalld_cluster_migrations ORDER BY name")
        assert [r[0] for r in await cur.fetchall()] == [name for name, _ in MIGRATIONS]
