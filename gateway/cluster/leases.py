"""One run at a time per session across nodes: a lease on a PostgreSQL advisory lock.

``async with leases.hold(session_key): …`` takes a session-level ``pg_advisory_lock`` on a
connection of its own, held for the run's life and closed after it. PostgreSQL queues the
waiters of one lock in arrival order, so sends through several nodes run in the order they
asked. When a node dies its connections die with it (a killed process at once; a vanished
machine within about 25 s, by the server-side TCP keepalives of ``schema.connect``), the server
releases its locks, and the next waiter on another node runs.

Locks use the two-``int4`` key space (apart from the single-``bigint`` keys of the migration
locks): ``LEASE_CLASS`` and 32 bits of the session key. Two sessions sharing those 32 bits
only queue behind each other; they never run together wrongly.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog

from .schema import connect

__all__ = ["LEASE_CLASS", "Lease", "SessionLeases", "lease_key"]

log = structlog.get_logger(__name__)

# "rcld" as an int4: the class of every run lease.
LEASE_CLASS = int.from_bytes(b"rcld", "big")

_Conn = psycopg.AsyncConnection[tuple[Any, ...]]


def lease_key(session_key: str) -> tuple[int, int]:
    """The two int4 keys of a session's lease (a session key is 32 random hex digits)."""
    low = int(session_key[:8], 16)
    return LEASE_CLASS, low - (1 << 32) if low >= 1 << 31 else low


@dataclass(frozen=True, slots=True)
class Lease:
    """A held lease: ``backend_pid`` is the server process whose connection holds the lock."""

    session_key: str
    backend_pid: int


class SessionLeases:
    """Leases for this node's runs; each one costs a database connection while held or awaited."""

    def __init__(self, dsn: str, *, node_id: str = "node", connect_timeout_s: float = 10.0) -> None:
        self._dsn = dsn
        self._node_id = node_id
        self._connect_timeout_s = connect_timeout_s

    @contextlib.asynccontextmanager
    async def hold(self, session_key: str) -> AsyncIterator[Lease]:
        """Wait (in arrival order) until no other holder has this session, hold it for the
        block, release it after. Cancelling a wait leaves the queue at once."""
        conn = await connect(self._dsn, connect_timeout_s=self._connect_timeout_s,
                             application_name=f"recalld-lease-{self._node_id[:12]}")
        try:
            await self._acquire(conn, session_key)
            yield Lease(session_key, conn.info.backend_pid)
        finally:
            # Closing the connection releases the lock, whatever state the block left it in.
            with contextlib.suppress(psycopg.Error):
                await conn.close()

    @staticmethod
    async def _acquire(conn: _Conn, session_key: str) -> None:
        try:
            await conn.execute("SELECT pg_advisory_lock(%s, %s)", lease_key(session_key))
        except asyncio.CancelledError:
            # Leave the server's queue now, not whenever it next writes to this socket.
            with contextlib.suppress(psycopg.Error):
                await conn.cancel_safe()
            raise
