"""A connection's reply budget (``limits.max_reply_bytes``): the one place that decides whether a
call may start building its reply and whether the reply it built may be held. No I/O.

Every reply of a connection counts against one :class:`ReplyBudget`, single calls and batch
entries alike:

- a call that may build a big reply first *reserves* an estimate (the most one page of a
  listing method builds) and starts only while the bytes held plus the reservations of the calls
  already running leave room for it; otherwise it waits for one of them to finish. A call that
  finds nothing else running and still no room starts anyway only when nothing is held either
  (a lone call, as ever); behind replies held and not read it is refused without being built
  (:meth:`ReplyBudget.start_call`), since its reply could be held only once those are read;
- once built and encoded, a reply is *held* only if it fits beside the bytes already held;
  otherwise it is replaced by the budget error (:func:`over_budget`);
- the transport *releases* a reply's bytes once the socket has taken them.

So a client that pipelines many big calls and never reads makes the daemon build a few pages at
a time, not all of them, and hold at most the budget. A call waiting for room is resumed only
when it starts or is refused (:meth:`ReplyBudget._decide`), so the others cost the loop nothing.
Freed room goes to the waiting calls in arrival order, across all of a user's connections, and
a call that arrives while a hand-off is due waits behind them.

A connection's budget also counts, once it has a user, in the budget that user's connections
share (:class:`UserBudgets`, ``limits.max_user_reply_bytes``): each check above must pass in
both, and "nothing else running" means nothing of the user's, so a client gains nothing by
spreading its calls over more connections.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from gateway.errors import GatewayError, InvalidRequest, RateLimited

__all__ = ["RETRY_AFTER_MS", "ReplyBudget", "UserBudgets", "over_budget"]

# How soon a client refused for the budget may send again: once it has read what was sent.
RETRY_AFTER_MS = 100


class ReplyBudget:
    """``limit``: ``limits.max_reply_bytes``; ``held``: bytes of replies built and not yet
    written; ``reserved``: estimates of the replies being built by the ``running`` calls;
    ``shared``: the budget of the user's connections this one also counts in, if any."""

    __slots__ = ("_wake_due", "_waiters", "held", "limit", "reserved", "running", "shared")

    def __init__(self, limit: int, held: int = 0) -> None:
        self.limit = limit
        self.held = held
        self.reserved = 0
        self.running = 0
        self.shared: ReplyBudget | None = None
        self._waiters: list[_Waiter] = []
        self._wake_due = False

    def room(self, reserve: int) -> bool:
        """Whether a call reserving ``reserve`` bytes fits beside what is held and reserved."""
        u = self.shared
        return self.held + self.reserved + reserve <= self.limit and (
            u is None or u.held + u.reserved + reserve <= u.limit)

    async def start(self, reserve: int, *, first: bool | None = True) -> bool:
        """Reserve ``reserve`` bytes for a call about to build its reply, waiting while running
        calls might still make room. With nothing left running and no room, a ``first`` call
        starts anyway; another returns False (not started: the caller refuses it); with
        ``first`` None (:meth:`start_call`), the call is first only while nothing is held."""
        if not self._must_wait(reserve) and not self._handing_off():
            return self._begin(reserve, first)
        waiter = _Waiter(asyncio.get_running_loop().create_future(), self, reserve, first)
        self._waiters.append(waiter)
        if self.shared is not None:
            self.shared._waiters.append(waiter)
        try:
            return await waiter.future  # decided, and counted, by the _wake that ended the wait
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled() and waiter.future.result():
                self.finish(reserve)  # started just as it was cancelled: the room goes to others
            raise

    def _must_wait(self, reserve: int) -> bool:
        return bool(self.running or (self.shared is not None and self.shared.running)) \
            and not self.room(reserve)

    def _handing_off(self) -> bool:
        # Room freed this turn is the waiting calls' first: a call arriving before the hand-off
        # queues behind them rather than take it.
        return self._wake_due or (self.shared is not None and self.shared._wake_due)

    def _begin(self, reserve: int, first: bool | None) -> bool:
        if first is None:
            # Judged here with the room, not once the call resumes: replies read in between
            # would let every call refused at one hand-off start at once, past the room.
            first = not (self.held or (self.shared is not None and self.shared.held))
        if not first and not self.room(reserve):
            return False
        self._count(1, reserve, 0)
        return True

    async def start_call(self, reserve: int) -> bool:
        """:meth:`start` for a single call: with nothing running and no room it starts only
        when nothing is held either, and otherwise returns False at once (the caller answers
        :meth:`refusal_unstarted`): building a reply that could not be held beside the unread
        ones would only be thrown away, at the cost of a page in memory."""
        return await self.start(reserve, first=None)

    def refusal_unstarted(self, reserve: int) -> GatewayError:
        """The error answering a call :meth:`start_call` did not start: which budget the
        replies waiting to be read fill."""
        u = self.shared
        if u is not None and u.held + reserve > u.limit and self.held + reserve <= self.limit:
            return RateLimited(
                f"not run: {u.held} bytes of earlier replies wait for this user's clients to read "
                f"them (limits.max_user_reply_bytes {u.limit})", RETRY_AFTER_MS)
        return RateLimited(
            f"not run: {self.held} bytes of earlier replies wait for this client to read them "
            f"(limits.max_reply_bytes {self.limit})", RETRY_AFTER_MS)

    def finish(self, reserve: int) -> None:
        """A call that :meth:`start` let run is done building (its reply, if any, is held)."""
        self._count(-1, -reserve, 0)
        self._wake_all()

    def fits(self, size: int) -> bool:
        u = self.shared
        return self.held + size <= self.limit and (u is None or u.held + size <= u.limit)

    def hold(self, size: int) -> None:
        self._count(0, 0, size)

    def hold_if_fits(self, size: int) -> bool:
        """:meth:`hold` ``size`` bytes if they :meth:`fits`; False, holding nothing, if not.
        What every reply does once encoded: one call, and the counting inlined (as in
        :meth:`release`), where fits, hold and ``_count`` were three per reply."""
        u = self.shared
        if self.held + size > self.limit or (u is not None and u.held + size > u.limit):
            return False
        self.held += size
        if u is not None:
            u.held += size
        return True

    def release(self, size: int) -> None:
        """The socket took ``size`` bytes of held replies (or they were given up)."""
        self.held -= size  # _count(0, 0, -size), inlined: once per reply
        u = self.shared
        if u is not None:
            u.held -= size
            if u._waiters:
                self._wake_all()
                return
        if self._waiters:  # nearly always nobody waits
            self._wake_all()

    def refusal(self, size: int) -> GatewayError:
        """The error replacing a reply of ``size`` bytes that does not :meth:`fits`."""
        u = self.shared
        if size <= self.limit and u is not None and u.held + size > u.limit:
            return RateLimited(
                f"replies not read: {u.held} bytes of earlier replies wait for this user's clients "
                f"to read them (limits.max_user_reply_bytes {u.limit})", RETRY_AFTER_MS)
        return over_budget(size, self.held, self.limit)

    def _count(self, running: int, reserved: int, held: int) -> None:
        self.running += running
        self.reserved += reserved
        self.held += held
        if self.shared is not None:
            self.shared.running += running
            self.shared.reserved += reserved
            self.shared.held += held

    def _wake_all(self) -> None:
        # The user's budget decides first: its waiters are all its connections' in arrival
        # order, where this connection's own would take the room ahead of earlier ones.
        if self.shared is not None:
            self.shared._wake()
        self._wake()

    def _wake(self) -> None:
        # Decided after the current step, as a woken task would: the call that finished holds
        # its reply before any waiter is counted against what is left.
        if self._waiters and not self._wake_due:
            self._wake_due = True
            asyncio.get_running_loop().call_soon(self._decide)

    def _decide(self) -> None:
        # Decided here, in arrival order (room depends on each one's reserve), so that only the
        # calls that start are resumed: a pipelined flood's hundreds of waiting tasks, each
        # woken to check for itself, queued ahead of another user's call in the event loop.
        self._wake_due = False
        waiting: list[_Waiter] = []
        for waiter in self._waiters:
            if waiter.future.done():  # decided by the other budget it waits in, or cancelled
                continue
            if waiter.budget._must_wait(waiter.reserve):
                waiting.append(waiter)
            else:
                waiter.future.set_result(waiter.budget._begin(waiter.reserve, waiter.first))
        self._waiters = waiting


@dataclass(frozen=True, slots=True)
class _Waiter:
    """A call waiting in :meth:`ReplyBudget.start`: its future gets whether it started."""

    future: asyncio.Future[bool]
    budget: ReplyBudget
    reserve: int
    first: bool | None


class UserBudgets:
    """The reply budget each user's connections share (``limits.max_user_reply_bytes``, at
    least ``limits.max_reply_bytes``), kept while the user has a connection."""

    __slots__ = ("_shared", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._shared: dict[str, tuple[ReplyBudget, int]] = {}

    def join(self, user: str, budget: ReplyBudget) -> None:
        """Count ``budget`` (a connection's, not yet in any) in ``user``'s from now on."""
        shared, n = self._shared.get(user) or (ReplyBudget(self.limit), 0)
        self._shared[user] = (shared, n + 1)
        budget.shared = shared
        shared._count(budget.running, budget.reserved, budget.held)

    def leave(self, user: str, budget: ReplyBudget) -> None:
        """A connection closed: whatever it still counts (nothing, once its calls have ended
        and given back what they held) leaves the user's budget with it."""
        shared = budget.shared
        if shared is None:
            return
        budget.shared = None
        shared._count(-budget.running, -budget.reserved, -budget.held)
        shared._wake()
        n = self._shared[user][1] - 1
        if n:
            self._shared[user] = (shared, n)
        else:
            del self._shared[user]

    def __len__(self) -> int:
        return len(self._shared)


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
