"""A connection's reply budget (``limits.max_reply_bytes``): the one place that decides whether a
call may start building its reply and whether the reply it built may be held. No I/O.

Every reply of a connection counts against one :class:`ReplyBudget`, single calls and batch
entries alike:

- a call that may build a big reply first *reserves* an estimate (the most one page of a
  listing method builds) and starts only while the bytes held plus the reservations of the calls
  already running leave room for it; otherwise it waits for one of them to finish. The first
  call to find nothing else running starts anyway, as a lone call always has;
- once built and encoded, a reply is *held* only if it fits beside the bytes already held;
  otherwise it is replaced by the budget error (:func:`over_budget`);
- the transport *releases* a reply's bytes once the socket has taken them.

So a client that pipelines many big calls and never reads makes the daemon build a few pages at
a time, not all of them, and hold at most the budget.
"""

from __future__ import annotations

import asyncio

from gateway.errors import GatewayError, InvalidRequest, RateLimited

__all__ = ["RETRY_AFTER_MS", "ReplyBudget", "over_budget"]

# How soon a client refused for the budget may send again: once it has read what was sent.
RETRY_AFTER_MS = 100


class ReplyBudget:
    """``limit``: ``limits.max_reply_bytes``; ``held``: bytes of replies built and not yet
    written; ``reserved``: estimates of the replies being built by the ``running`` calls."""

    __slots__ = ("_waiters", "held", "limit", "reserved", "running")

    def __init__(self, limit: int, held: int = 0) -> None:
        self.limit = limit
        self.held = held
        self.reserved = 0
        self.running = 0
        self._waiters: list[asyncio.Future[None]] = []

    def room(self, reserve: int) -> bool:
        """Whether a call reserving ``reserve`` bytes fits beside what is held and reserved."""
        return self.held + self.reserved + reserve <= self.limit

    async def start(self, reserve: int, *, first: bool = True) -> bool:
        """Reserve ``reserve`` bytes for a call about to build its reply, waiting while running
        calls might still make room. With nothing left running and no room, a ``first`` call
        starts anyway; another returns False (not started: the caller refuses it)."""
        while self.running and not self.room(reserve):
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter
        if not first and not self.room(reserve):
            return False
        self.running += 1
        self.reserved += reserve
        return True

    def finish(self, reserve: int) -> None:
        """A call that :meth:`start` let run is done building (its reply, if any, is held)."""
        self.running -= 1
        self.reserved -= reserve
        self._wake()

    def fits(self, size: int) -> bool:
        return self.held + size <= self.limit

    def hold(self, size: int) -> None:
        self.held += size

    def release(self, size: int) -> None:
        """The socket took ``size`` bytes of held replies (or they were given up)."""
        self.held -= size
        if self._waiters:  # released once per reply: nearly always nobody waits
            self._wake()

    def _wake(self) -> None:
        # Every waiter checks its own condition again: room depends on its reserve.
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


def over_budget(size: int, waiting: int, limit: int) -> GatewayError:
    """The error that replaces a reply of ``size`` bytes past the budget: -32600 when it alone
    is larger than the limit (asking again cannot help), else -32004."""
    if size > limit:
        return InvalidRequest(
            f"invalid request: the reply would be {size} bytes, more than limits.max_reply_bytes "
            f"({limit}); ask for less (a smaller limit, fewer batch entries)")
    return RateLimited(
        f"replies not read: {waiting} bytes of earlier replies wait for this client to read them "
        f"(limits.max_reply_bytes {limit})", RETRY_AFTER_MS)
