"""Run leases on PostgreSQL: one run at a time per session across nodes, fenced.

A session being run has one row in ``recalld_run_leases``: the holding run and node, an expiry
the holder's node renews while the run streams (``cluster.lease_renew_s``, through the pool, on
whichever connection the pool hands out: a database restart costs the lease nothing if the
database is back within ``cluster.lease_ttl_s``), and a **fencing token** from one sequence, so
every new holder carries a larger token than any before it. Every transcript append of the run
carries the token (``sessions.fence``) and is refused once the row holds another one. A lease
that expired (its node died, hung, or lost the database for longer than the TTL) is taken over
by the next node to ask, which then writes the ended run's terminal line under its own token.

``recalld_runs`` lists the runs appended but not finished (a queued run is a row, not a
connection): each node renews its own runs' rows with its leases, so a row that expired belongs
to a node that stopped. Nothing here waits on the server: a lease is taken or not at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import psycopg
from psycopg_pool import AsyncConnectionPool

from sessions import RunFence

__all__ = ["HeldLease", "Orphan", "RunLeases", "Taken"]

_Conn = psycopg.AsyncConnection[tuple[Any, ...]]

# clock_timestamp(), not now(): a transaction's now() is its start, and a lease is checked
# against the moment of the statement.
_TTL = "clock_timestamp() + make_interval(secs => %s)"
_HOLDER_SQL = """
SELECT user_id, run_id, partial, expires_at > clock_timestamp()
FROM recalld_run_leases WHERE session_key = %s FOR UPDATE"""
_INSERT_SQL = f"""
INSERT INTO recalld_run_leases (session_key, user_id, run_id, node, token, expires_at)
VALUES (%s, %s, %s, %s, nextval('recalld_lease_tokens'), {_TTL})
ON CONFLICT (session_key) DO NOTHING RETURNING token"""
_TAKE_OVER_SQL = f"""
UPDATE recalld_run_leases
SET user_id = %s, run_id = %s, node = %s, token = nextval('recalld_lease_tokens'),
    expires_at = {_TTL}, partial = ''
WHERE session_key = %s AND expires_at <= clock_timestamp() RETURNING token"""
_RENEW_RUNS_SQL = f"UPDATE recalld_runs SET expires_at = {_TTL} WHERE run_id = ANY(%s)"
# Rows of this node's runs that it no longer has (a close whose delete failed).
_FORGET_OWN_SQL = "DELETE FROM recalld_runs WHERE node = %s AND NOT (run_id = ANY(%s))"
# An expired lease is never renewed: it may be being taken over.
_RENEW_LEASES_SQL = f"""
UPDATE recalld_run_leases l SET expires_at = {_TTL}, partial = COALESCE(c.partial, l.partial)
FROM unnest(%s::bigint[], %s::text[]) AS c(token, partial)
WHERE l.token = c.token AND l.node = %s AND l.expires_at > clock_timestamp() RETURNING l.token"""


@dataclass(frozen=True, slots=True)
class Orphan:
    """The run whose expired lease was just taken over: what its terminal line needs
    (``partial``: its node's last checkpoint of the reply)."""

    user: str
    session_key: str
    run_id: str
    partial: str


@dataclass(frozen=True, slots=True)
class Taken:
    token: int
    orphan: Orphan | None  # the previous holder, when its lease had expired


@dataclass(eq=False)
class HeldLease:
    """A lease this node holds for a run: renewed by the node's keeper until released.

    ``valid_until`` (monotonic) is when the lease may have expired on the server, counted from
    before the last renew that succeeded; past it, or once ``fence.lost``, the run publishes and
    writes nothing more and its ``task`` is cancelled."""

    user: str
    session_key: str
    run_id: str
    fence: RunFence
    valid_until: float
    task: asyncio.Task[Any] | None = None
    partial: list[str] = field(default_factory=list)  # the deltas published so far
    checkpointed: int = 0  # len(partial) at the last checkpoint written

    @property
    def token(self) -> int:
        return self.fence.token

    def usable(self) -> bool:
        if not self.fence.lost and time.monotonic() > self.valid_until:
            self.lose()
        return not self.fence.lost

    def lose(self) -> None:
        """The lease is gone (or may be): stop the run, which then writes nothing."""
        self.fence.lost = True
        if self.task is not None and not self.task.done():
            self.task.cancel()


class RunLeases:
    """The lease and run rows of one node, over the node's pool."""

    def __init__(self, pool: AsyncConnectionPool[_Conn], *, node_id: str, ttl_s: float,
                 channel: str) -> None:
        self._pool = pool
        self.node_id = node_id
        self.ttl_s = ttl_s
        self._channel = channel

    async def register(self, user: str, session_key: str, run_id: str) -> None:
        """The run is live from now on, before its user message is appended."""
        async with self._pool.connection() as conn:
            await conn.execute(
                f"INSERT INTO recalld_runs (run_id, session_key, user_id, node, expires_at)"
                f" VALUES (%s, %s, %s, %s, {_TTL})",
                (run_id, session_key, user, self.node_id, self.ttl_s))

    async def live_runs(self, run_ids: Sequence[str]) -> set[str]:
        """Those of ``run_ids`` whose node still renews them."""
        if not run_ids:
            return set()
        async with self._pool.connection() as conn:
            cur = await conn.execute("SELECT run_id FROM recalld_runs WHERE run_id = ANY(%s)"
                                     " AND expires_at > clock_timestamp()", (list(run_ids),))
            return {str(row[0]) for row in await cur.fetchall()}

    async def take(self, user: str, session_key: str, run_id: str) -> Taken | None:
        """The session's lease for ``run_id`` with a new token, or None while another holds it."""
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(_HOLDER_SQL, (session_key,))
            holder = await cur.fetchone()
            if holder is None:
                cur = await conn.execute(_INSERT_SQL,
                                         (session_key, user, run_id, self.node_id, self.ttl_s))
                row = await cur.fetchone()
                return None if row is None else Taken(int(row[0]), None)
            if holder[3]:
                return None
            cur = await conn.execute(_TAKE_OVER_SQL,
                                     (user, run_id, self.node_id, self.ttl_s, session_key))
            row = await cur.fetchone()
            if row is None:
                return None
            return Taken(int(row[0]),
                         Orphan(str(holder[0]), session_key, str(holder[1]), str(holder[2])))

    async def release(self, session_key: str, token: int | None, run_id: str) -> None:
        """Forget the run and, if it held one, let its lease go and wake the session's waiters
        on every node (a notify on the bus channel, read by ``EventBus``)."""
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute("DELETE FROM recalld_runs WHERE run_id = %s", (run_id,))
            if token is None:
                return
            await conn.execute(
                "DELETE FROM recalld_run_leases WHERE session_key = %s AND token = %s",
                               (session_key, token))
            await conn.execute("SELECT pg_notify(%s, %s)", (
                self._channel, orjson.dumps({"n": self.node_id, "l": session_key}).decode()))

    async def forget_run(self, run_id: str) -> None:
        async with self._pool.connection() as conn:
            await conn.execute("DELETE FROM recalld_runs WHERE run_id = %s", (run_id,))

    async def forget_dead(self, session_key: str, *, keep: Sequence[str]) -> None:
        """Drop the session's run rows of other nodes that stopped renewing them, but ``keep``'s."""
        async with self._pool.connection() as conn:
            await conn.execute("DELETE FROM recalld_runs WHERE session_key = %s AND node <> %s"
                               " AND expires_at <= clock_timestamp() AND NOT (run_id = ANY(%s))",
                               (session_key, self.node_id, list(keep)))

    async def renew(self, run_ids: Sequence[str],
                    leases: Sequence[tuple[int, str | None]]) -> set[int]:
        """Renew this node's runs and leases (``(token, checkpoint or None)``) in one
        transaction; returns the tokens still held."""
        runs = list(run_ids)
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute(_RENEW_RUNS_SQL, (self.ttl_s, runs))
            await conn.execute(_FORGET_OWN_SQL, (self.node_id, runs))
            if not leases:
                return set()
            cur = await conn.execute(_RENEW_LEASES_SQL, (
                self.ttl_s, [t for t, _ in leases], [p for _, p in leases], self.node_id))
            return {int(row[0]) for row in await cur.fetchall()}

    async def expired(self, limit: int) -> list[tuple[str, str, str]]:
        """``(user, session, run)`` of leases that expired: runs whose node stopped mid-run."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT user_id, session_key, run_id FROM recalld_run_leases"
                " WHERE expires_at <= clock_timestamp() ORDER BY expires_at LIMIT %s", (limit,))
            return [(str(u), str(k), str(r)) for u, k, r in await cur.fetchall()]

    async def dead_run_sessions(self, limit: int) -> list[tuple[str, str]]:
        """``(user, session)`` with a run row of another node that stopped renewing it."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT DISTINCT user_id, session_key FROM recalld_runs"
                " WHERE expires_at <= clock_timestamp() AND node <> %s LIMIT %s",
                (self.node_id, limit))
            return [(str(u), str(k)) for u, k in await cur.fetchall()]
