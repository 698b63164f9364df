"""Whether this node's database answers: what ``gateway.health`` reports as ``storage`` and what
``GET /readyz`` answers a load balancer.

On ``storage.backend = "postgres"`` a node that cannot reach its database can serve nothing
that matters (every session, message and memory call needs it), yet its process is alive:
``/healthz`` (liveness) stays 200 while ``/readyz`` turns 503, so a load balancer stops
sending it new connections without a supervisor restarting it. :class:`DatabaseCheck` asks
the database ``SELECT 1`` every ``storage.check_interval_s`` on one connection of its own
(not a pool's: a pool busy with slow calls is not an outage), each try bounded by
``storage.call_timeout_s``; health and readiness read its last answer and never wait on I/O,
so they stay cheap under load. With SQLite the store is the data dir: always ready here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any, Literal

import structlog

from gateway.errors import pg_reason

__all__ = ["DatabaseCheck", "StorageState"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class StorageState:
    """The database as the last check found it; ``reason`` says why it is not ``ok``."""

    backend: Literal["sqlite", "postgres"]
    ok: bool = True
    reason: str | None = None
    since: float = 0.0  # time.monotonic() of the last change


# The embedded store has no server to lose: its state never changes (one object, not one a call:
# gateway.health is the benchmarks' inline method, and runs on every health poll).
SQLITE_STATE = StorageState("sqlite")


class DatabaseCheck:
    """The periodic ``SELECT 1`` behind readiness; :meth:`run` until cancelled."""

    def __init__(self, dsn: str, *, interval_s: float, timeout_s: float) -> None:
        self._dsn = dsn
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        # The node has just opened its stores on this database: it starts ready.
        self.state = StorageState("postgres", since=time.monotonic())
        self.checks = 0  # finished checks (tests wait on it)

    def unready_reason(self) -> str | None:
        """None while the database answers, else why not (what ``/readyz`` keys on)."""
        return None if self.state.ok else self.state.reason

    async def run(self) -> None:
        import psycopg  # the postgres extra, present whenever this check is made

        conn: Any = None
        try:
            while True:
                try:
                    async with asyncio.timeout(self._timeout_s):
                        if conn is None or conn.closed:
                            conn = await psycopg.AsyncConnection.connect(
                                self._dsn, autocommit=True,
                                connect_timeout=max(2, round(self._timeout_s)),
                                application_name="recalld-readiness")
                        await conn.execute("SELECT 1")
                    self._set(None)
                except (psycopg.Error, TimeoutError) as exc:
                    self._set(_reason(exc, self._timeout_s))
                    await _dropped(conn)
                    conn = None
                self.checks += 1
                await asyncio.sleep(self._interval_s)
        finally:
            await _dropped(conn)

    def _set(self, reason: str | None) -> None:
        was = self.state
        if (reason is None) == was.ok and (reason is None or reason == was.reason):
            return
        now = time.monotonic()
        self.state = StorageState("postgres", reason is None, reason, now)
        if reason is None:
            log.info("storage.reachable", down_s=round(now - was.since, 2))
        elif was.ok:
            log.warning("storage.unreachable", reason=reason)


def _reason(exc: BaseException, timeout_s: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"the database did not answer within {timeout_s:g} s (storage.call_timeout_s)"
    return f"the database is unreachable: {pg_reason(exc)}"


async def _dropped(conn: Any) -> None:
    if conn is not None:
        with contextlib.suppress(Exception):
            await conn.close()
