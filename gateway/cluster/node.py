"""This node's place among the others on one database: what ``gateway.app`` starts when
``storage.backend = "postgres"``.

:class:`ClusterHub` is the local ``Hub`` that also hands each event to the :class:`EventBus`
(through one queue and one sender task, so the events of a run leave in the order they were
published) and receives the other nodes' events for its own subscribers only.
:class:`ClusterNode` owns the bus, the idempotency pool and :class:`ClusterRuns`; ``start()``
raises ``psycopg.Error`` when the server cannot be reached, ``close()`` is safe to call twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import psycopg
import structlog
from psycopg_pool import AsyncConnectionPool

from gateway.chat import Hub

from .bus import EventBus
from .runs import ClusterRuns, RunHooks, RunStore

__all__ = ["ClusterHub", "ClusterNode"]

log = structlog.get_logger(__name__)

_ENDED_KEPT = 10_000
_TERMINAL = frozenset({"chat.final", "chat.error", "chat.aborted"})
_Event = tuple[str, str, str, Mapping[str, Any]]


class _LocalOnly:
    """The bus's delivery target: this node's subscribers, never back onto the bus."""

    def __init__(self, hub: ClusterHub) -> None:
        self._hub = hub

    def publish(self, user: str, session_key: str, method: str, params: Mapping[str, Any]) -> int:
        self._hub.track(session_key, method, params)
        return Hub.publish(self._hub, user, session_key, method, params)


class ClusterHub(Hub):
    """A ``Hub`` whose events also go to the other nodes."""

    def __init__(self, max_outbound: int = 10_000) -> None:
        super().__init__()
        # Past max_outbound (storage.max_outbound_events) events are dropped, not queued: they
        # carry seq, so a client on another node sees the gap and reads sessions.history.
        self._max_outbound = max_outbound
        self._outbound: asyncio.Queue[_Event] = asyncio.Queue(max_outbound)
        self._dropped = 0
        self.local = _LocalOnly(self)
        # (session, run) -> the last seq seen of a run not yet ended, from any node: a run
        # whose node died is ended with the seq after it (run_ended_elsewhere).
        self._last_seq: dict[tuple[str, str], int] = {}
        self._ended: OrderedDict[tuple[str, str], None] = OrderedDict()  # recent terminal events
        self._queued = self._forwarded = 0  # events put on / taken off the outbound queue
        # A heap by target count (the middle number keeps futures from being compared).
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._tiebreak = itertools.count()

    def track(self, session_key: str, method: str, params: Mapping[str, Any]) -> None:
        run_id, seq = params.get("runId"), params.get("seq")
        if not method.startswith("chat.") or not isinstance(run_id, str) or not isinstance(seq, int):
            return
        if method in _TERMINAL:
            self._last_seq.pop((session_key, run_id), None)
            self._ended[(session_key, run_id)] = None
            if len(self._ended) > _ENDED_KEPT:
                self._ended.popitem(last=False)
        else:
            self._last_seq[(session_key, run_id)] = seq

    def run_ended_elsewhere(self, user: str, session_key: str, run_id: str) -> None:
        """Tell every node's subscribers that a run whose node died ended (aborted); a run whose
        end they were already told (one dropped from its queue) is not announced twice."""
        if (session_key, run_id) in self._ended:
            return
        seq = self._last_seq.get((session_key, run_id), -1) + 1
        self.publish(user, session_key, "chat.aborted",
                     {"sessionKey": session_key, "runId": run_id, "seq": seq, "partial": ""})

    def publish(self, user: str, session_key: str, method: str, params: Mapping[str, Any]) -> int:
        self.track(session_key, method, params)
        try:
            self._outbound.put_nowait((user, session_key, method, params))
            self._queued += 1
        except asyncio.QueueFull:
            self._dropped += 1
            if self._dropped == 1 or self._dropped % 1000 == 0:
                log.warning("cluster.events_dropped", dropped=self._dropped, method=method,
                            limit=self._max_outbound)
        return super().publish(user, session_key, method, params)

    async def forward(self, bus: EventBus) -> None:
        """Send queued events to the bus one after another, until cancelled."""
        while True:
            user, session_key, method, params = await self._outbound.get()
            try:
                await bus.publish(user, session_key, method, params)
            finally:
                self._forwarded += 1
                while self._waiters and self._waiters[0][0] <= self._forwarded:
                    *_, done = heapq.heappop(self._waiters)
                    if not done.done():
                        done.set_result(None)

    async def sent(self) -> None:
        """Wait until every event queued so far has been handed to the bus (not the ones
        queued after: under load the queue is never empty)."""
        target = self._queued
        if self._forwarded >= target:
            return
        done = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (target, next(self._tiebreak), done))
        await done


class ClusterNode:
    """The bus, the shared idempotency keys and the run tickets of one node."""

    def __init__(self, dsn: str, hub: ClusterHub, store: RunStore, *, connect_timeout_s: float = 10.0,
                 pool_size: int = 4, bus_wait_s: float = 5.0, close_flush_s: float = 2.0) -> None:
        self.node_id = uuid.uuid4().hex
        self.hub = hub
        self.bus = EventBus(dsn, hub.local, node_id=self.node_id, connect_timeout_s=connect_timeout_s)
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[tuple[Any, ...]]] = AsyncConnectionPool(
            dsn, min_size=1, max_size=pool_size, open=False, timeout=connect_timeout_s,
            kwargs={"connect_timeout": max(1, round(connect_timeout_s))}, name="recalld-cluster",
            check=AsyncConnectionPool.check_connection)
        hooks = RunHooks(recovered=hub.run_ended_elsewhere, caught_up=self.bus.barrier, sent=hub.sent,
                         wait_s=bus_wait_s)
        self.runs = ClusterRuns(dsn, store, self._pool, hooks, connect_timeout_s=connect_timeout_s)
        self._connect_timeout_s = connect_timeout_s
        self._close_flush_s = close_flush_s
        self._forwarder: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Listen, migrate, open the pool and start forwarding; on failure, close what opened."""
        try:
            await self.bus.start()
            await self._pool.open(wait=True, timeout=self._connect_timeout_s)
        except BaseException:
            await asyncio.shield(self.close())
            raise
        self._forwarder = asyncio.create_task(self.hub.forward(self.bus), name="cluster-forward")
        log.info("cluster.joined", node=self.node_id)

    async def close(self) -> None:
        if self._forwarder is not None and not self._forwarder.done():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._close_flush_s):
                    await self.hub.sent()
        if self._forwarder is not None:
            self._forwarder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._forwarder
            self._forwarder = None
        await self.bus.close()
        await self._pool.close()
