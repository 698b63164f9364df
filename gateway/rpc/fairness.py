"""Fair shares between users: at most ``limits.max_user_running`` calls of one user run at once,
across all of that user's connections; the rest wait their turn, in arrival order. No I/O.

The worker threads that run blocking work (the session store, SQLite) are shared by everyone
and serve in order of arrival, so without a cap one user's pipelined flood queues hundreds of
jobs ahead of another user's single call. With it, a call of a quiet user finds at most a
few jobs of each busy user ahead of it. Waiting calls are not refused: each connection's
``limits.max_inflight`` already bounds how many a client can have waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass, field

__all__ = ["UserSlots"]


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
