"""One run at a time per session across nodes, in append order, and runs of dead nodes ended.

A run's :class:`LeaseTicket` is a database connection named after the run
(``recalld-run-<runId>``), opened before the run's user message is appended: while it is open,
the run is *live* (``pg_stat_activity`` lists it on every node); a node that dies takes its
connections, its leases and its runs' liveness with it. ``hold()`` takes the session's lease
(``pg_advisory_lock``, waiters in arrival order) and then settles the session's earlier runs:

* an earlier user message with no reply whose run is live elsewhere goes first: the lease is
  let go and asked for again, so runs execute in the order their messages were appended;
* an earlier one whose run is live nowhere (its node died mid-run, or it was dropped from a
  queue) gets an empty assistant message marked ``aborted`` — the user message stays, and
  whoever reads the history sees how that run ended — and a ``chat.aborted`` event goes to
  every node's subscribers (``RunHooks.recovered``), unless its end was already announced.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg
import structlog
from psycopg_pool import AsyncConnectionPool

from sessions import Message

from .idempotency import IdempotencyKeys
from .leases import lease_key
from .schema import connect

__all__ = ["RUN_APP_PREFIX", "ClusterRuns", "LeaseTicket", "RunHooks", "unanswered_before"]

log = structlog.get_logger(__name__)

RUN_APP_PREFIX = "recalld-run-"
# How far back a run looks for earlier unanswered runs of its session: at most
# chat.max_queued_runs per node are waiting, so a few hundred messages cover any cluster.
SETTLE_WINDOW = 400
# After stepping aside for an earlier live run, wait this long before queueing again, so that
# run's node (which may not have asked for the lease yet) gets it first.
YIELD_DELAY_S = 0.05

_Conn = psycopg.AsyncConnection[tuple[Any, ...]]


@dataclass(frozen=True, slots=True)
class RunHooks:
    """What tickets need of the node's event path (``ClusterNode`` builds them)."""

    recovered: Callable[[str, str, str], None]  # (user, session, run) ended here for a dead node
    caught_up: Callable[[], Awaitable[object]]  # every other node's earlier events received
    sent: Callable[[], Awaitable[None]]  # every event this node queued handed to the bus
    # Waiting for the bus (hold's catch-up, close's send) never holds a run longer than this
    # (storage.bus_wait_s): events lost meanwhile are what a client's seq gap is for.
    wait_s: float = 5.0


async def _bounded(wait: Awaitable[object], wait_s: float, event: str, session_key: str) -> None:
    try:
        async with asyncio.timeout(wait_s):
            await wait
    except TimeoutError:
        log.warning(event, session=session_key, waited_s=wait_s)


class RunStore(Protocol):
    """What settling needs of the sessions store (``sessions.PgSessionStore`` fits)."""

    def recent_messages(self, user: str, session_key: str, n: int) -> list[Message]: ...

    def append_message(self, user: str, session_key: str, *, role: str, content: str,
                       run_id: str | None = ..., extra: dict[str, Any] | None = ...) -> Message: ...


def unanswered_before(messages: list[Message], run_id: str) -> list[str]:
    """Run ids of the user messages before ``run_id``'s own that no assistant message of the
    same run answers, in append order."""
    answered = {m.run_id for m in messages if m.role == "assistant" and m.run_id}
    pending: list[str] = []
    for m in messages:
        if m.role != "user" or not m.run_id:
            continue
        if m.run_id == run_id:
            return pending
        if m.run_id not in answered:
            pending.append(m.run_id)
    return pending  # our own message is older than the window: nothing before it is read


class LeaseTicket:
    """One run's connection: its liveness while open, its session's lease once held."""

    def __init__(self, conn: _Conn, store: RunStore, user: str, session_key: str, run_id: str,
                 hooks: RunHooks) -> None:
        self._conn = conn
        self._hooks = hooks
        self._store = store
        self._user = user
        self._session_key = session_key
        self._run_id = run_id

    async def hold(self) -> None:
        key = lease_key(self._session_key)
        while True:
            try:
                await self._conn.execute("SELECT pg_advisory_lock(%s, %s)", key)
            except asyncio.CancelledError:
                # Leave the server's queue now, not whenever it next writes to this socket.
                with contextlib.suppress(psycopg.Error):
                    await self._conn.cancel_safe()
                raise
            if not await self._earlier_live_run():
                break
            await self._conn.execute("SELECT pg_advisory_unlock(%s, %s)", key)
            await asyncio.sleep(YIELD_DELAY_S)
        # The previous holder's last events were sent before it let go; receive them before
        # this run's first one, so every node's subscribers see the runs one after the other.
        await _bounded(self._hooks.caught_up(), self._hooks.wait_s, "cluster.catch_up_timeout", self._session_key)

    async def _earlier_live_run(self) -> bool:
        """Under the lease: end the earlier runs that are live nowhere; True when one is live."""
        messages = await asyncio.to_thread(self._store.recent_messages, self._user, self._session_key,
                                           SETTLE_WINDOW)
        pending = unanswered_before(messages, self._run_id)
        if not pending:
            return False
        cur = await self._conn.execute(
            "SELECT application_name FROM pg_stat_activity WHERE application_name = ANY(%s)",
            ([RUN_APP_PREFIX + r for r in pending],))
        live = {str(row[0]).removeprefix(RUN_APP_PREFIX) for row in await cur.fetchall()}
        for run_id in pending:
            if run_id in live:
                return True
            await asyncio.to_thread(self._store.append_message, self._user, self._session_key,
                                    role="assistant", content="", run_id=run_id, extra={"aborted": True})
            self._hooks.recovered(self._user, self._session_key, run_id)
            log.warning("cluster.run_recovered", session=self._session_key, run=run_id,
                        outcome="aborted", reason="its node stopped before the reply was written")
        return False

    async def close(self) -> None:
        if self._conn.closed:
            return
        # This run's events leave before the lease does (see hold); closing the connection
        # releases the lease, whatever state the run left it in.
        await _bounded(self._hooks.sent(), self._hooks.wait_s, "cluster.send_timeout", self._session_key)
        with contextlib.suppress(psycopg.Error):
            await self._conn.close()


class ClusterRuns:
    """The postgres backend's ``gateway.chat.gate.RunGate``: shared idempotency keys and
    per-run lease tickets."""

    def __init__(self, dsn: str, store: RunStore, pool: AsyncConnectionPool[_Conn], hooks: RunHooks, *,
                 connect_timeout_s: float = 10.0) -> None:
        self._dsn = dsn
        self._hooks = hooks
        self._store = store
        self._keys = IdempotencyKeys(pool)
        self._connect_timeout_s = connect_timeout_s

    async def claim(self, user: str, session_key: str, key: str, run_id: str, ttl_s: float) -> str:
        return await self._keys.claim(user, session_key, key, run_id, ttl_s)

    async def release(self, user: str, session_key: str, key: str, run_id: str) -> None:
        await self._keys.release(user, session_key, key, run_id)

    async def ticket(self, user: str, session_key: str, run_id: str) -> LeaseTicket:
        conn = await connect(self._dsn, connect_timeout_s=self._connect_timeout_s,
                             application_name=RUN_APP_PREFIX + run_id)
        return LeaseTicket(conn, self._store, user, session_key, run_id, self._hooks)
