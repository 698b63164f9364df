"""One run at a time per session across nodes, in append order, fenced; runs of dead or hung
nodes ended.

A run's :class:`LeaseTicket` registers the run (a row of ``recalld_runs``, renewed by its node)
before its user message is appended, so every node sees it as *live* from the moment its
message exists; a queued run holds no database connection. ``hold()`` takes the session's lease
(``leases.RunLeases``; a free lease is taken at once, a held one waited for: its release wakes
the waiters of every node through the bus, a poll every ``cluster.lease_renew_s`` covers a lost
wake-up) and then settles the session's earlier runs:

* an earlier user message with no reply whose run is live elsewhere goes first: the lease is
  let go and asked for again, so runs execute in the order their messages were appended;
* an earlier one whose run is live nowhere (its node died with it queued, or it was dropped
  from a queue) gets an empty assistant message marked ``aborted`` and a ``chat.aborted`` event
  to every node's subscribers (``RunHooks.recovered``), unless its end was already announced.

While held, the lease is renewed by the node's keeper (:meth:`ClusterRuns.start`), which also
writes the run's partial reply into the lease row as a checkpoint. A run whose lease is lost (a
renew that finds it taken or expired, or no renew for ``cluster.lease_ttl_s``) is cancelled and
writes nothing more: its appends carry the lease's token (``sessions.fence``) and the hub drops
its events. The keeper ends the runs of other nodes' expired leases without waiting for a message
(*orphans*): it takes the lease with a new token, appends the run's terminal line — the last
checkpointed partial, marked ``failed`` — and sends ``chat.error`` (retryable) to the session's
subscribers on every node (``RunHooks.orphaned``); a run taken over by ``hold()`` is ended
the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg
import structlog
from psycopg_pool import AsyncConnectionPool

from sessions import RUN_FENCE, Message, RunFence

from .idempotency import IdempotencyKeys
from .leases import HeldLease, Orphan, RunLeases

__all__ = ["ORPHAN_LINE_ERROR", "ClusterRuns", "LeaseTicket", "RunHooks", "unanswered_before"]

log = structlog.get_logger(__name__)

# How far back a run looks for earlier unanswered runs of its session: at most
# chat.max_queued_runs per node are waiting, so a few hundred messages cover any cluster.
SETTLE_WINDOW = 400
# After stepping aside for an earlier live run, wait this long before asking again, so that
# run's node (which may not have asked for the lease yet) gets it first.
YIELD_DELAY_S = 0.05
# Sessions the keeper ends orphans in per round (the rest wait for the next round).
_REAP_BATCH = 50
# The `error` of an orphan's terminal line.
ORPHAN_LINE_ERROR = "its node stopped before the reply was finished"

_Conn = psycopg.AsyncConnection[tuple[Any, ...]]


@dataclass(frozen=True, slots=True)
class RunHooks:
    """What tickets need of the node's event path (``ClusterNode`` builds them)."""

    recovered: Callable[[str, str, str], None]  # (user, session, run) never started, ended here
    orphaned: Callable[[str, str, str, str], None]  # (user, session, run, partial) lease expired
    ended: Callable[[str, str], bool]  # (session, run): its terminal event was seen
    hold: Callable[[HeldLease], None]  # the run publishes under this lease from now on
    let_go: Callable[[HeldLease], None]
    caught_up: Callable[[], Awaitable[object]]  # every other node's earlier events received
    sent: Callable[[str], Awaitable[None]]  # every event of this user queued so far sent
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


def unanswered_before(messages: list[Message], run_id: str | None) -> list[str]:
    """Run ids of the user messages before ``run_id``'s own (None: all) that no assistant
    message of the same run answers, in append order."""
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


def _answered(messages: list[Message], run_id: str) -> bool:
    return any(m.role == "assistant" and m.run_id == run_id for m in messages)


class LeaseTicket:
    """One run's place across nodes: live while open, its session's lease once held."""

    def __init__(self, runs: ClusterRuns, user: str, session_key: str, run_id: str) -> None:
        self._runs = runs
        self._user = user
        self._session_key = session_key
        self._run_id = run_id
        self._held: HeldLease | None = None
        self._closed = False

    async def hold(self) -> None:
        """Take the session's lease in append order, then run fenced (in the calling task)."""
        runs = self._runs
        while True:
            # Watched before asking, so a release that lands while the answer is on its way
            # is not missed.
            free = runs.watch(self._session_key)
            try:
                taken = await runs.leases.take(self._user, self._session_key, self._run_id)
                if taken is None:
                    await runs.wait_free(free)
                    continue
            finally:
                runs.unwatch(self._session_key, free)
            held = self._held = runs.keep(self._user, self._session_key, self._run_id, taken.token)
            held.task = asyncio.current_task()
            # Every append of this run (its reply, in worker threads) carries the lease's token.
            RUN_FENCE.set(held.fence)
            if taken.orphan is not None:
                await runs.end_orphan(taken.orphan, held.fence)
            messages = await asyncio.to_thread(runs.store.recent_messages, self._user,
                                               self._session_key, SETTLE_WINDOW)
            if _answered(messages, self._run_id):
                # Another node ended this run as dead while this node could not renew it (the
                # database was gone for longer than the TTL): it must not answer twice.
                held.fence.lost = True
                log.warning("cluster.run_already_ended", session=self._session_key,
                            run=self._run_id)
                raise asyncio.CancelledError  # ends as an abort that writes and says nothing
            if not await runs.settle(self._user, self._session_key, self._run_id, messages,
                                     held.fence):
                break
            await self._let_go()
            await asyncio.sleep(YIELD_DELAY_S)
        # The previous holder's last events were sent before it let go; receive them before
        # this run's first one, so every node's subscribers see the runs one after the other.
        await _bounded(runs.hooks.caught_up(), runs.hooks.wait_s, "cluster.catch_up_timeout",
                       self._session_key)

    async def _let_go(self) -> None:
        held, self._held = self._held, None
        if held is None:
            return
        RUN_FENCE.set(None)
        self._runs.drop(held)
        with contextlib.suppress(psycopg.Error):
            await self._runs.leases.release(self._session_key, held.token, "")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        runs = self._runs
        # This run's events leave before the lease does (see hold).
        await _bounded(runs.hooks.sent(self._user), runs.hooks.wait_s, "cluster.send_timeout",
                       self._session_key)
        held, self._held = self._held, None
        if held is not None:
            runs.drop(held)
        try:
            await runs.leases.release(self._session_key,
                                      None if held is None or held.fence.lost else held.token,
                                      self._run_id)
        except (psycopg.Error, OSError) as err:
            # The lease then expires by itself; the next holder finds this run answered
            # (or ends it).
            log.warning("cluster.release_failed", session=self._session_key, run=self._run_id,
                        error=str(err).strip())
        except Exception as err:
            if not type(err).__module__.startswith("psycopg_pool"):
                raise
            log.warning("cluster.release_failed", session=self._session_key, run=self._run_id,
                        error=str(err))
        finally:
            runs.closed(self._run_id, self._session_key)


class ClusterRuns:
    """The postgres backend's ``gateway.chat.gate.RunGate``: shared idempotency keys, per-run
    lease tickets, and the keeper that renews this node's leases and ends other nodes' orphans."""

    def __init__(self, store: RunStore, pool: AsyncConnectionPool[_Conn], leases: RunLeases,
                 hooks: RunHooks, *, renew_s: float = 2.5) -> None:
        self.store = store
        self.leases = leases
        self.hooks = hooks
        self._keys = IdempotencyKeys(pool)
        self._renew_s = renew_s
        self._open: set[str] = set()  # run ids of this node's open tickets
        self._held: dict[int, HeldLease] = {}  # token -> lease held here
        self._free: dict[str, asyncio.Event] = {}  # session -> set when its lease may be free
        self._keeper: asyncio.Task[None] | None = None
        self._renew_failing = False

    async def claim(self, user: str, session_key: str, key: str, run_id: str, ttl_s: float) -> str:
        return await self._keys.claim(user, session_key, key, run_id, ttl_s)

    async def release(self, user: str, session_key: str, key: str, run_id: str) -> None:
        await self._keys.release(user, session_key, key, run_id)

    async def ticket(self, user: str, session_key: str, run_id: str) -> LeaseTicket:
        self._open.add(run_id)
        try:
            await self.leases.register(user, session_key, run_id)
        except BaseException:
            self._open.discard(run_id)
            raise
        return LeaseTicket(self, user, session_key, run_id)

    # -- what tickets use ------------------------------------------------------------------

    def keep(self, user: str, session_key: str, run_id: str, token: int) -> HeldLease:
        # Taken a moment ago with a full TTL: valid until TTL after this (a little early).
        held = HeldLease(user, session_key, run_id, RunFence(session_key, token),
                         time.monotonic() + self.leases.ttl_s)
        self._held[token] = held
        self.hooks.hold(held)
        return held

    def drop(self, held: HeldLease) -> None:
        self._held.pop(held.token, None)
        self.hooks.let_go(held)

    def closed(self, run_id: str, session_key: str) -> None:
        self._open.discard(run_id)
        self.released(session_key)

    def released(self, session_key: str) -> None:
        """The session's lease was let go (here, or on another node: the bus says so)."""
        event = self._free.get(session_key)
        if event is not None:
            event.set()

    def watch(self, session_key: str) -> asyncio.Event:
        """An event set when the session's lease is let go (one waiter per session per node:
        its lane's running run)."""
        event = self._free[session_key] = asyncio.Event()
        return event

    def unwatch(self, session_key: str, event: asyncio.Event) -> None:
        if self._free.get(session_key) is event:
            del self._free[session_key]

    async def wait_free(self, event: asyncio.Event) -> None:
        """Until ``event`` (the lease was let go), or a renew interval passed: a poll in case
        the release's notify was lost."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._renew_s):
                await event.wait()

    async def settle(self, user: str, session_key: str, run_id: str | None, messages: list[Message],
                     fence: RunFence) -> bool:
        """Under the lease: end the earlier runs that are live nowhere; True when one is live."""
        pending = unanswered_before(messages, run_id)
        if not pending:
            return False
        live = await self.leases.live_runs(pending) | (self._open & set(pending))
        for earlier in pending:
            if earlier in live:
                return True
            await self._append(fence, user, session_key, earlier, "", {"aborted": True})
            with contextlib.suppress(psycopg.Error):
                await self.leases.forget_run(earlier)
            self.hooks.recovered(user, session_key, earlier)
            log.warning("cluster.run_recovered", session=session_key, run=earlier,
                        outcome="aborted", reason="its node stopped before the run started")
        return False

    async def end_orphan(self, orphan: Orphan, fence: RunFence) -> None:
        """Under a lease just taken over: the terminal line of the run that held it before,
        unless that run wrote one (it ended, then its node stopped before letting go)."""
        messages = await asyncio.to_thread(self.store.recent_messages, orphan.user,
                                           orphan.session_key, SETTLE_WINDOW)
        with contextlib.suppress(psycopg.Error):
            await self.leases.forget_run(orphan.run_id)
        if (_answered(messages, orphan.run_id)
                or not any(m.run_id == orphan.run_id for m in messages)):
            return  # ended already, or a reaper's own lease (no message of that run)
        await self._append(fence, orphan.user, orphan.session_key, orphan.run_id, orphan.partial,
                           {"failed": True, "error": ORPHAN_LINE_ERROR})
        if not self.hooks.ended(orphan.session_key, orphan.run_id):
            self.hooks.orphaned(orphan.user, orphan.session_key, orphan.run_id, orphan.partial)
        log.warning("cluster.run_recovered", session=orphan.session_key, run=orphan.run_id,
                    outcome="failed", partial_chars=len(orphan.partial),
                    reason="its lease expired mid-run")

    async def _append(self, fence: RunFence, user: str, session_key: str, run_id: str, content: str,
                      extra: dict[str, Any]) -> None:
        def write() -> None:
            RUN_FENCE.set(fence)  # this worker thread's copy of the context only
            self.store.append_message(user, session_key, role="assistant", content=content,
                                      run_id=run_id, extra=extra)

        await asyncio.to_thread(write)

    # -- the keeper ------------------------------------------------------------------------

    def start(self) -> None:
        if self._keeper is None:
            self._keeper = asyncio.create_task(self._keep(), name="cluster-leases")

    async def close(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
            self._keeper = None

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(self._renew_s)
            if await self._renew():
                await self._reap()

    async def _renew(self) -> bool:
        """Renew this node's runs and leases; lose the leases that were taken or that went
        unrenewed for the TTL. False when the database could not be reached."""
        held = list(self._held.values())
        started = time.monotonic()
        checkpoints: list[tuple[int, str | None]] = []
        for lease in held:
            changed = len(lease.partial) != lease.checkpointed
            checkpoints.append((lease.token, "".join(lease.partial) if changed else None))
        try:
            async with asyncio.timeout(self._renew_s * 2):
                kept = await self.leases.renew(sorted(self._open), checkpoints)
        except Exception as err:  # the database is away: the TTL decides, not one failure
            if not self._renew_failing:
                log.warning("cluster.renew_failed", error=str(err).strip() or type(err).__name__,
                            leases=len(held))
            self._renew_failing = True
            for lease in held:
                lease.usable()  # loses it past the TTL
            return False
        if self._renew_failing:
            log.info("cluster.renew_recovered", leases=len(held))
            self._renew_failing = False
        for lease, (_, checkpoint) in zip(held, checkpoints, strict=True):
            if lease.token in kept:
                lease.valid_until = started + self.leases.ttl_s
                if checkpoint is not None:
                    lease.checkpointed = len(lease.partial)
            elif not lease.fence.lost and self._held.get(lease.token) is lease:
                log.warning("cluster.lease_lost", session=lease.session_key, run=lease.run_id)
                lease.lose()
        return True

    async def _reap(self) -> None:
        """End the runs of other nodes' expired leases and the runs left queued by stopped nodes."""
        try:
            for user, session_key, run_id in await self.leases.expired(_REAP_BATCH):
                await self._end_in(user, session_key, run_id)
            for user, session_key in await self.leases.dead_run_sessions(_REAP_BATCH):
                await self._end_in(user, session_key, "")
        except Exception as err:
            log.warning("cluster.reap_failed", error=str(err).strip() or type(err).__name__)

    async def _end_in(self, user: str, session_key: str, run_id: str) -> None:
        """Take the session's lease (as ``run_id``: an orphan's own, so a reaper that dies on
        the way leaves it to the next), end what is orphaned or dead in it, let it go."""
        taken = await self.leases.take(user, session_key, run_id)
        if taken is None:
            return
        fence = RunFence(session_key, taken.token)
        try:
            if taken.orphan is not None:
                await self.end_orphan(taken.orphan, fence)
            messages = await asyncio.to_thread(self.store.recent_messages, user, session_key,
                                               SETTLE_WINDOW)
            await self.settle(user, session_key, None, messages, fence)
            # The dead rows left are of runs that were answered (their node stopped after the
            # reply); those still unanswered (behind a live run) stay for a later round.
            await self.leases.forget_dead(session_key, keep=unanswered_before(messages, None))
        finally:
            await self.leases.release(session_key, taken.token, "")
