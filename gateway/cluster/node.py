"""This node's place among the others on one database: what ``gateway.app`` starts when
``storage.backend = "postgres"``.

:class:`ClusterHub` is the local ``Hub`` that also hands each event to the :class:`EventBus`
and receives the other nodes' events for its own subscribers only. Its outbound events wait in
one queue per user, sent in turn (one event of each user with events waiting, round after
round), so one user's flood delays another user's events by at most one event per round; the
events of one user (and so of one run) leave in the order they were published. Past
``storage.max_outbound_events`` queued, an event of whichever user queued the most is dropped —
never a terminal event (``chat.final``, ``chat.error``, ``chat.aborted``): a client that misses
deltas sees the seq gap, one that missed the end would wait forever.

It also silences the runs whose lease this node lost (``HeldLease``): their events go nowhere,
the node that took the lease over announces how they ended.
:class:`ClusterNode` owns the bus, the pool and :class:`ClusterRuns`; ``start()`` raises
``psycopg.Error`` when the server cannot be reached, ``close()`` is safe to call twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import OrderedDict, deque
from collections.abc import Mapping
from typing import Any

import psycopg
import structlog
from psycopg_pool import AsyncConnectionPool

from gateway.chat import Hub
from gateway.chat.finish import event_error
from gateway.errors import UpstreamError

from .bus import CHANNEL, EventBus
from .leases import HeldLease, RunLeases
from .runs import ClusterRuns, RunHooks, RunStore

__all__ = ["ORPHAN_REASON", "ClusterHub", "ClusterNode"]

log = structlog.get_logger(__name__)

_ENDED_KEPT = 10_000
_TERMINAL = frozenset({"chat.final", "chat.error", "chat.aborted"})
_Event = tuple[str, str, str, Mapping[str, Any]]
# What chat.error says of a run whose node stopped (or lost the database) mid-reply: the
# upstream of that client, the node writing the reply, cut its stream (status null).
ORPHAN_REASON = ("the node writing this reply stopped before it finished (its lease on the "
                 "session expired); send the message again")


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
        self._max_outbound = max_outbound
        # user -> its queued events, each with its number among that user's events.
        self._queues: dict[str, deque[tuple[int, _Event]]] = {}
        self._turns: deque[str] = deque()  # the users with events queued, in sending order
        self._size = 0
        self._numbered: dict[str, int] = {}  # user -> number of its last event queued
        self._has_events = asyncio.Event()
        self._dropped = 0
        self.local = _LocalOnly(self)
        # (session, run) -> the last seq seen of a run not yet ended, from any node: a run
        # whose node died is ended with the seq after it (run_ended_elsewhere).
        self._last_seq: dict[tuple[str, str], int] = {}
        self._ended: OrderedDict[tuple[str, str], None] = OrderedDict()  # recent terminal events
        self._waiters: dict[str, list[tuple[int, asyncio.Future[None]]]] = {}
        self._held: dict[tuple[str, str], HeldLease] = {}  # this node's leased runs

    def track(self, session_key: str, method: str, params: Mapping[str, Any]) -> None:
        run_id, seq = params.get("runId"), params.get("seq")
        if (not method.startswith("chat.") or not isinstance(run_id, str)
                or not isinstance(seq, int)):
            return
        if method in _TERMINAL:
            self._last_seq.pop((session_key, run_id), None)
            self._ended[(session_key, run_id)] = None
            if len(self._ended) > _ENDED_KEPT:
                self._ended.popitem(last=False)
        else:
            self._last_seq[(session_key, run_id)] = seq

    def hold(self, lease: HeldLease) -> None:
        """``lease``'s run publishes through it from now on (its deltas are its checkpoint)."""
        self._held[(lease.session_key, lease.run_id)] = lease

    def let_go(self, lease: HeldLease) -> None:
        if self._held.get((lease.session_key, lease.run_id)) is lease:
            del self._held[(lease.session_key, lease.run_id)]

    def ended(self, session_key: str, run_id: str) -> bool:
        """Whether this node saw the run's terminal event (from any node)."""
        return (session_key, run_id) in self._ended

    def run_ended_elsewhere(self, user: str, session_key: str, run_id: str) -> None:
        """Tell every node's subscribers that a run that never started here or anywhere (its
        node died with it queued) ended (aborted); one whose end they were already told (one
        dropped from its queue) is not announced twice."""
        self._announce(user, session_key, run_id, "chat.aborted", {"partial": ""})

    def run_orphaned(self, user: str, session_key: str, run_id: str, partial: str) -> None:
        """Tell every node's subscribers that a run whose lease expired mid-reply ended:
        ``chat.error``, retryable, with the partial its node last checkpointed."""
        error = event_error(UpstreamError(ORPHAN_REASON, None, True))
        self._announce(user, session_key, run_id, "chat.error",
                       {"error": error, "partial": partial})

    def _announce(self, user: str, session_key: str, run_id: str, method: str,
                  fields: dict[str, Any]) -> None:
        if (session_key, run_id) in self._ended:
            return
        seq = self._last_seq.get((session_key, run_id), -1) + 1
        params = {"sessionKey": session_key, "runId": run_id, "seq": seq, **fields}
        self.track(session_key, method, params)
        self._queue(user, session_key, method, params)
        Hub.publish(self, user, session_key, method, params)

    def publish(self, user: str, session_key: str, method: str, params: Mapping[str, Any]) -> int:
        run_id = params.get("runId")
        held = self._held.get((session_key, run_id)) if isinstance(run_id, str) else None
        if held is not None:
            if not held.usable():
                return 0  # its lease is gone: the node that took it over says how the run ended
            if method == "chat.delta":
                held.partial.append(str(params.get("delta", "")))
        self.track(session_key, method, params)
        self._queue(user, session_key, method, params)
        return super().publish(user, session_key, method, params)

    def _queue(self, user: str, session_key: str, method: str, params: Mapping[str, Any]) -> None:
        if (self._size >= self._max_outbound and method not in _TERMINAL
                and not self._make_room(user)):
            self._dropped += 1
            if self._dropped == 1 or self._dropped % 1000 == 0:
                log.warning("cluster.events_dropped", dropped=self._dropped, method=method,
                            limit=self._max_outbound)
            return
        number = self._numbered[user] = self._numbered.get(user, 0) + 1
        queue = self._queues.get(user)
        if queue is None:
            queue = self._queues[user] = deque()
            self._turns.append(user)
        queue.append((number, (user, session_key, method, params)))
        self._size += 1
        self._has_events.set()

    def _make_room(self, user: str) -> bool:
        """Drop the newest non-terminal event of the user with the most queued, if that is
        another user than ``user`` and has more queued than ``user``; True if one was dropped."""
        mine = len(self._queues.get(user, ()))
        biggest = max(self._queues, key=lambda u: len(self._queues[u]), default=user)
        queue = self._queues.get(biggest)
        if biggest == user or queue is None or len(queue) <= mine + 1:
            return False
        for i in range(len(queue) - 1, -1, -1):
            if queue[i][1][2] not in _TERMINAL:
                del queue[i]
                self._size -= 1
                self._dropped += 1
                if self._dropped == 1 or self._dropped % 1000 == 0:
                    log.warning("cluster.events_dropped", dropped=self._dropped,
                                user_flooding=biggest, limit=self._max_outbound)
                return True
        return False

    async def forward(self, bus: EventBus) -> None:
        """Send queued events to the bus, one user's event after another's, until cancelled."""
        while True:
            while not self._turns:
                self._has_events.clear()
                await self._has_events.wait()
            user = self._turns.popleft()
            queue = self._queues.get(user)
            if not queue:
                self._queues.pop(user, None)
                self._settle(user)
                continue
            _, event = queue.popleft()
            self._size -= 1
            if queue:
                self._turns.append(user)
            else:
                del self._queues[user]
            try:
                await bus.publish(*event)
            finally:
                self._settle(user)

    def _settle(self, user: str) -> None:
        """Wake the waiters of ``user`` whose events have all left."""
        waiters = self._waiters.get(user)
        if not waiters:
            return
        queue = self._queues.get(user)
        left = queue[0][0] - 1 if queue else self._numbered.get(user, 0)
        keep = []
        for target, done in waiters:
            if target <= left:
                if not done.done():
                    done.set_result(None)
            else:
                keep.append((target, done))
        if keep:
            self._waiters[user] = keep
        else:
            del self._waiters[user]

    async def sent(self, user: str | None = None) -> None:
        """Wait until every event of ``user`` (None: of every user) queued so far has been
        handed to the bus (not the ones queued after: under load the queue is never empty)."""
        users = [user] if user is not None else list(self._queues)
        waits = []
        for u in users:
            queue = self._queues.get(u)
            if not queue:
                continue
            done = asyncio.get_running_loop().create_future()
            self._waiters.setdefault(u, []).append((self._numbered[u], done))
            waits.append(done)
        if waits:
            await asyncio.gather(*waits)


class ClusterNode:
    """The bus, the pool, the shared idempotency keys, the run leases and tickets of one node."""

    def __init__(self, dsn: str, hub: ClusterHub, store: RunStore, *,
                 connect_timeout_s: float = 10.0, pool_size: int = 4, bus_wait_s: float = 5.0,
                 close_flush_s: float = 2.0, lease_ttl_s: float = 10.0, lease_renew_s: float = 2.5,
                 call_timeout_s: float | None = None, reconnect_timeout_s: float | None = None,
                 options: str = "") -> None:
        self.node_id = uuid.uuid4().hex
        self.hub = hub
        # The same deadlines as the session and memory pools (gateway.storage.pool_settings): a
        # call waits at most call_timeout_s for a connection while the database is down, and the
        # pool retries a lost server every reconnect_timeout_s rather than backing off for minutes.
        kwargs: dict[str, Any] = {"connect_timeout": max(1, round(connect_timeout_s))}
        if options:
            kwargs["options"] = options
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[tuple[Any, ...]]] = \
            AsyncConnectionPool(
                dsn, min_size=1, max_size=pool_size, open=False,
                timeout=connect_timeout_s if call_timeout_s is None else call_timeout_s,
                kwargs=kwargs, name="recalld-cluster", check=AsyncConnectionPool.check_connection,
                # psycopg's default
                reconnect_timeout=300.0 if reconnect_timeout_s is None else reconnect_timeout_s)
        leases = RunLeases(self._pool, node_id=self.node_id, ttl_s=lease_ttl_s, channel=CHANNEL)
        hooks = RunHooks(recovered=hub.run_ended_elsewhere, orphaned=hub.run_orphaned,
                         ended=hub.ended, hold=hub.hold, let_go=hub.let_go,
                         caught_up=self._caught_up, sent=hub.sent, wait_s=bus_wait_s)
        self.runs = ClusterRuns(store, self._pool, leases, hooks, renew_s=lease_renew_s)
        self.bus = EventBus(dsn, hub.local, node_id=self.node_id,
                            connect_timeout_s=connect_timeout_s, on_released=self.runs.released)
        self._connect_timeout_s = connect_timeout_s
        self._close_flush_s = close_flush_s
        self._forwarder: asyncio.Task[None] | None = None

    async def _caught_up(self) -> object:
        return await self.bus.barrier()

    async def start(self) -> None:
        """Listen, migrate, open the pool, start forwarding and keeping leases; on failure,
        close what opened."""
        try:
            await self.bus.start()
            await self._pool.open(wait=True, timeout=self._connect_timeout_s)
        except BaseException:
            await asyncio.shield(self.close())
            raise
        self._forwarder = asyncio.create_task(self.hub.forward(self.bus), name="cluster-forward")
        self.runs.start()
        log.info("cluster.joined", node=self.node_id)

    async def close(self) -> None:
        await self.runs.close()
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
