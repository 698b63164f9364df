"""Fair shares between users, at two levels. No sockets.

- :class:`UserSlots`: at most ``limits.max_user_running`` calls of one user run at once, across
  all of that user's connections; the rest wait their turn, in arrival order. Without it one
  user's pipelined flood queues hundreds of jobs ahead of another user's single call.
- :class:`FairThreads`: the event loop's worker threads (``asyncio.to_thread``: the session
  store, SQLite, hashing) take at most ``limits.max_user_threads`` jobs of one user at once; the
  user's next jobs wait in the user's own queue. The store's index answers one job at a time and
  the jobs share one interpreter lock, so eight running calls of one user, each with a job in a
  thread, put eight jobs ahead of another user's; with one (the default), a quiet user's job
  finds at most one of each busy user's before it (issue 22, t16). Calls waiting on the network
  (an upstream model, embeddings) hold a slot of the first kind but no thread, so they do not
  count here.

The caller of a job is :data:`CALLER`, which the RPC core sets for the call it runs (a task of
its own, whose context the job's ``to_thread`` copies); work of no caller (start-up, the
indexer) goes to the threads as before. Waiting calls and jobs are not refused: each
connection's ``limits.max_inflight`` already bounds how many a client can have waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CALLER", "FairThreads", "UserSlots", "fair_threads"]

# The user whose call the current task runs (None: no call's, e.g. the indexer's).
CALLER: ContextVar[str | None] = ContextVar("recalld_caller", default=None)


@dataclass(slots=True)
class _Lane:
    running: int = 0
    waiters: deque[asyncio.Future[None]] = field(default_factory=deque)


class UserSlots:
    """``cap`` calls per user at once; :meth:`enter` waits for a slot, :meth:`leave` hands it on."""

    __slots__ = ("_lanes", "cap")

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._lanes: dict[str, _Lane] = {}

    def running(self, user: str) -> int:
        lane = self._lanes.get(user)
        return lane.running if lane else 0

    async def enter(self, user: str) -> None:
        lane = self._lanes.get(user)
        if lane is None:
            lane = self._lanes[user] = _Lane()
        if lane.running < self.cap and not lane.waiters:
            lane.running += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        lane.waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.leave(user)  # handed a slot just as it was cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):
                    lane.waiters.remove(waiter)
            raise

    def leave(self, user: str) -> None:
        lane = self._lanes[user]
        while lane.waiters:
            waiter = lane.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot goes to it: running stays the same
                return
        lane.running -= 1
        if not lane.running:
            del self._lanes[user]


@dataclass(slots=True)
class _ThreadLane:
    running: int = 0
    waiting: deque[tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = \
        field(default_factory=deque)


class FairThreads(ThreadPoolExecutor):
    """A thread pool (the loop's default executor) that runs at most ``per_user`` jobs of one
    :data:`CALLER` at once; a user's other jobs wait, in order, for one of theirs to end."""

    def __init__(self, per_user: int, max_workers: int | None = None) -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix="recalld-worker")
        self.per_user = per_user
        self._fair_lock = threading.Lock()
        self._lanes: dict[str, _ThreadLane] = {}

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        user = CALLER.get()
        if user is None:
            return super().submit(fn, *args, **kwargs)
        future: Future[Any] = Future()
        with self._fair_lock:
            lane = self._lanes.get(user)
            if lane is None:
                lane = self._lanes[user] = _ThreadLane()
            if lane.running >= self.per_user:
                lane.waiting.append((future, fn, args, kwargs))
                return future
            lane.running += 1
        self._start(user, future, fn, args, kwargs)
        return future

    def running(self, user: str) -> int:
        """Jobs of ``user`` in the threads now."""
        with self._fair_lock:
            lane = self._lanes.get(user)
            return lane.running if lane else 0

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        # Jobs still waiting for their user's turn go to the pool now (or are cancelled with
        # the pool's own), so that shutting down waits for them as it would for any job.
        with self._fair_lock:
            waiting = [job for lane in self._lanes.values() for job in lane.waiting]
            for lane in self._lanes.values():
                lane.waiting.clear()
        for future, fn, args, kwargs in waiting:
            if cancel_futures:
                future.cancel()
            else:
                self._start(None, future, fn, args, kwargs)
        super().shutdown(wait, cancel_futures=cancel_futures)

    def _start(self, user: str | None, future: Future[Any], fn: Callable[..., Any],
               args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            super().submit(self._run, user, future, fn, args, kwargs)
        except RuntimeError as exc:  # the pool was shut down meanwhile
            if future.set_running_or_notify_cancel():
                future.set_exception(exc)
            self._done(user)

    def _run(self, user: str | None, future: Future[Any], fn: Callable[..., Any],
             args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            if future.set_running_or_notify_cancel():  # False: cancelled while it waited
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:
                    future.set_exception(exc)
                else:
                    future.set_result(result)
        finally:
            self._done(user)

    def _done(self, user: str | None) -> None:
        """A job of ``user`` ended: the user's next waiting job takes its place."""
        if user is None:
            return
        with self._fair_lock:
            lane = self._lanes[user]
            if not lane.waiting:
                lane.running -= 1
                if not lane.running:
                    del self._lanes[user]
                return
            job = lane.waiting.popleft()
        self._start(user, *job)


_INSTALLED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, FairThreads] = \
    weakref.WeakKeyDictionary()


def fair_threads(per_user: int) -> FairThreads:
    """Make the running loop's default executor a :class:`FairThreads` of ``per_user`` jobs per
    user, and return it. Once per loop: a second app started on the same loop (tests) shares it
    and sets its cap. The loop shuts it down when it closes, as it would its own."""
    loop = asyncio.get_running_loop()
    pool = _INSTALLED.get(loop)
    if pool is None:
        pool = _INSTALLED[loop] = FairThreads(per_user)
        loop.set_default_executor(pool)
    pool.per_user = per_user
    return pool
