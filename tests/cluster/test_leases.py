"""The run lease: across two nodes one holder per session at a time, waiters served in
arrival order, and a holder whose connection dies lets the next one in."""

from __future__ import annotations

import asyncio

import psycopg

from gateway.cluster import LEASE_CLASS, SessionLeases

KEY = "5f0c" + "0" * 28


async def _waiting(dsn: str, count: int) -> None:
    """Return once ``count`` lease requests wait in the server's queue."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        async with asyncio.timeout(60):  # stops a broken test from hanging; nothing is measured
            while True:
                cur = await conn.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                    " AND classid::bigint = %s", (LEASE_CLASS,))
                row = await cur.fetchone()
                if row is not None and row[0] == count:
                    return
                await asyncio.sleep(0.05)


async def test_holders_never_overlap_and_waiters_go_in_arrival_order(pg_dsn: str) -> None:
    """A holder on node A, then four waiters alternating between nodes A and B, each queued
    before the next arrives: they run one at a time, in the order they arrived."""
    nodes = [SessionLeases(pg_dsn, node_id="A"), SessionLeases(pg_dsn, node_id="B")]
    order: list[int] = []
    inside = 0
    most_inside = 0
    release_first = asyncio.Event()

    async def run(i: int) -> None:
        nonlocal inside, most_inside
        async with nodes[i % 2].hold(KEY):
            inside += 1
            most_inside = max(most_inside, inside)
            order.append(i)
            if i == 0:
                await release_first.wait()
            else:
                await asyncio.sleep(0)  # let any overlapping holder show itself
            inside -= 1

    tasks = [asyncio.create_task(run(0))]
    await _waiting(pg_dsn, 0)
    while not order:
        await asyncio.sleep(0.01)
    for i in range(1, 5):
        tasks.append(asyncio.create_task(run(i)))
        await _waiting(pg_dsn, i)
    release_first.set()
    async with asyncio.timeout(60):
        await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4] and most_inside == 1


async def test_a_dead_holders_lease_goes_to_the_next_waiter(pg_dsn: str) -> None:
    """Killing the holding connection (pg_terminate_backend, as when its node dies) lets the
    waiter on the other node in; a different session never waited at all."""
    a, b = SessionLeases(pg_dsn, node_id="A"), SessionLeases(pg_dsn, node_id="B")
    got_it = asyncio.Event()

    async def wait_on_b() -> None:
        async with b.hold(KEY):
            got_it.set()

    async with a.hold(KEY) as lease:
        async with b.hold("f" * 32):
            pass  # another session is not held up by this one
        waiter = asyncio.create_task(wait_on_b())
        await _waiting(pg_dsn, 1)
        assert not got_it.is_set()
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", (lease.backend_pid,))
        async with asyncio.timeout(60):
            await waiter
    assert got_it.is_set()


async def test_a_cancelled_wait_leaves_the_queue(pg_dsn: str) -> None:
    """A waiter whose task is cancelled is out of the server's queue at once."""
    leases = SessionLeases(pg_dsn)
    async with leases.hold(KEY):
        async def wait() -> None:
            async with leases.hold(KEY):
                raise AssertionError("the lease was never free")

        waiter = asyncio.create_task(wait())
        await _waiting(pg_dsn, 1)
        waiter.cancel()
        try:
            await waiter
        except asyncio.CancelledError:
            pass
        await _waiting(pg_dsn, 0)
