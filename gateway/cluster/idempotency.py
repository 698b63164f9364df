"""``chat.send`` idempotency keys shared by every node: the first claim of a key wins.

``claim(user, session_key, key, run_id, ttl_s)`` inserts ``(user, session, key) → run_id``
unless a live row holds that key, and returns the run id that owns it: the caller's own when
it won, the first sender's when it is a retry (through this node or another). An expired row
is taken over. ``release`` frees a key whose run never started (its append failed), so a
retry is carried out, as the single-node gateway does.

A database that is down or too slow is the storage error (``StorageFailed``, retryable, with
the pool's or the server's reason), answered within ``call_timeout_s`` (the pool's own
timeout when None): a send with a key is never an internal error because the keys' table
could not be reached.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from gateway.errors import PG_RETRY_AFTER_MS, StorageFailed, pg_reason

__all__ = ["IdempotencyKeys"]

_Conn = psycopg.AsyncConnection[tuple[Any, ...]]

# ON CONFLICT … WHERE: an expired row is replaced, a live one left as it is (no row returned).
_CLAIM_SQL = """
INSERT INTO recalld_idempotency AS i (user_id, session_key, key, run_id, expires_at)
VALUES (%(user)s, %(session)s, %(key)s, %(run)s, now() + make_interval(secs => %(ttl)s))
ON CONFLICT (user_id, session_key, key) DO UPDATE
    SET run_id = EXCLUDED.run_id, expires_at = EXCLUDED.expires_at
    WHERE i.expires_at <= now()
RETURNING run_id"""
_OWNER_SQL = """
SELECT run_id FROM recalld_idempotency
WHERE user_id = %(user)s AND session_key = %(session)s AND key = %(key)s AND expires_at > now()"""


class IdempotencyKeys:
    """Claims on ``recalld_idempotency`` through a small pool (the tables come from
    ``gateway.cluster.schema.migrate``)."""

    def __init__(self, pool: AsyncConnectionPool[_Conn], *,
                 call_timeout_s: float | None = None) -> None:
        self._pool = pool
        self._call_timeout_s = call_timeout_s

    @contextlib.asynccontextmanager
    async def _connection(self, action: str) -> AsyncIterator[_Conn]:
        try:
            async with self._pool.connection(timeout=self._call_timeout_s) as conn:
                yield conn
        except psycopg.OperationalError as exc:  # PoolTimeout included: the server down or slow
            raise StorageFailed(f"idempotency keys unavailable while {action}: {pg_reason(exc)}",
                                retry_after_ms=PG_RETRY_AFTER_MS) from exc

    async def claim(self, user: str, session_key: str, key: str, run_id: str, ttl_s: float) -> str:
        """The run id that owns ``key`` now: ``run_id`` if this claim won."""
        args = {"user": user, "session": session_key, "key": key, "run": run_id, "ttl": ttl_s}
        async with self._connection("claiming a key") as conn:
            # Twice at most: the live row found by the insert may expire before it is read.
            for _ in range(2):
                cur = await conn.execute(_CLAIM_SQL, args)
                row = await cur.fetchone()
                if row is None:
                    cur = await conn.execute(_OWNER_SQL, args)
                    row = await cur.fetchone()
                if row is not None:
                    return str(row[0])
        return run_id  # pragma: no cover - a row that expired twice within two statements

    async def release(self, user: str, session_key: str, key: str, run_id: str) -> None:
        """Free ``key`` if ``run_id`` still owns it (its run never started)."""
        async with self._connection("releasing a key") as conn:
            await conn.execute(
                "DELETE FROM recalld_idempotency"
                " WHERE user_id = %s AND session_key = %s AND key = %s AND run_id = %s",
                (user, session_key, key, run_id),
            )

    async def sweep(self) -> int:
        """Delete expired keys; returns how many."""
        async with self._connection("sweeping expired keys") as conn:
            cur = await conn.execute("DELETE FROM recalld_idempotency WHERE expires_at <= now()")
            return cur.rowcount
