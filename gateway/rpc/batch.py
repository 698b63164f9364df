"""A batch frame run within one reply budget. No I/O.

The entries of a batch run concurrently, as JSON-RPC allows, but each is encoded as soon as it
is answered, and its bytes count against the budget the transport gives the whole frame
(``limits.max_reply_bytes`` less the bytes of earlier replies still waiting to be written):

- an entry starts only while the bytes already produced, plus ``reserve`` for it and for each
  entry still running, fit the budget (``reserve`` is the most one page of a listing method
  builds, so entries that each return a big page run a few at a time, not all at once); the
  first entry always starts, as a single call would;
- when the next entry cannot fit and nothing is left running, it and every later entry answer
  -32004 without running (a notification among them is dropped, it is owed nothing);
- an entry that ran but whose reply does not fit answers the budget error in its place.

So what one frame builds is bounded by its budget plus the few pages in flight, however many
entries it holds, and what it did build is never encoded twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import GatewayError, InvalidRequest, RateLimited

__all__ = ["ReplyBudget", "over_budget", "run_batch"]

# How soon a client refused for the budget may send again: once it has read what was sent.
RETRY_AFTER_MS = 100
# An error entry without its id: the envelope and the longest message below, with room to spare.
_ERROR_BYTES = 400


@dataclass(frozen=True, slots=True)
class ReplyBudget:
    """``limit``: ``limits.max_reply_bytes``; ``waiting``: bytes of this connection's earlier
    replies not yet written."""

    limit: int
    waiting: int = 0

    @property
    def left(self) -> int:
        return self.limit - self.waiting


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


def _batch_full(used: int, waiting: int, limit: int, ran: bool) -> GatewayError:
    what = "its reply does not fit" if ran else "not run"
    return RateLimited(
        f"{what}: this batch's replies already take {used} bytes and {waiting} bytes of earlier "
        f"replies wait to be read (limits.max_reply_bytes {limit}); send the rest in a later frame",
        RETRY_AFTER_MS)


def _error_room(entry: Any) -> int:
    """Bytes an error answering ``entry`` takes at most (its id, the longest message above)."""
    owed, req_id = _entry_id(entry)
    return _ERROR_BYTES + len(orjson.dumps(req_id)) if owed else 0


def _entry_id(entry: Any) -> tuple[bool, Any]:
    """Whether ``entry`` is owed a reply, and the id to answer it with."""
    if not isinstance(entry, dict):
        return True, None
    if "id" not in entry:
        return False, None
    req_id = entry["id"]
    valid = req_id is None or isinstance(req_id, str) or (
        isinstance(req_id, int | float) and not isinstance(req_id, bool))
    return True, req_id if valid else None


async def run_batch(
    entries: Sequence[Any],
    one: Callable[[Any], Awaitable[dict[str, Any] | None]],
    encode: Callable[[dict[str, Any]], tuple[bytes, bool]],
    budget: ReplyBudget | None,
    reserve: int,
) -> tuple[bytes | None, bool]:
    """The encoded array answering ``entries`` (None when nothing is owed) and whether any
    entry is an error. ``one`` answers an entry; ``encode`` turns its reply into bytes (and
    says whether they hold an error)."""
    parts: list[bytes | None] = [None] * len(entries)
    errors = [False] * len(entries)
    # Room kept for each entry not yet answered to answer an error instead, so refusals never
    # take the array past the budget.
    error_room = [_error_room(entry) for entry in entries]
    pending = sum(error_room)
    used = 1  # "[" ; each part adds its bytes and one "," or "]"
    running = 0
    changed = asyncio.Condition()

    def settle(i: int, data: bytes | None, is_error: bool) -> None:
        nonlocal used, pending
        pending -= error_room[i]
        if data is not None:
            parts[i], errors[i] = data, is_error
            used += len(data) + 1

    def refuse(i: int, error: GatewayError) -> None:
        owed, req_id = _entry_id(entries[i])
        data = orjson.dumps({"jsonrpc": "2.0", "id": req_id, "error": error.to_object()}) if owed else None
        settle(i, data, True)

    async def run(i: int) -> None:
        nonlocal running
        try:
            reply = await one(entries[i])
            if reply is None:
                settle(i, None, False)
                return
            data, is_error = encode(reply)
            others = pending - error_room[i]
            if budget is not None and used + len(data) + 1 + others > budget.left:
                if len(data) + 2 > budget.limit:  # even alone in "[…]" it could not fit
                    refuse(i, over_budget(len(data) + 2, budget.waiting, budget.limit))
                else:
                    refuse(i, _batch_full(used, budget.waiting, budget.limit, True))
            else:
                settle(i, data, is_error)
        finally:
            running -= 1
            async with changed:
                changed.notify_all()

    def room(left: int) -> bool:
        return used + pending + reserve * (running + 1) <= left

    async with asyncio.TaskGroup() as group:
        for i in range(len(entries)):
            if budget is not None and i > 0:
                left = budget.left
                async with changed:
                    # Wait while a running entry might still make room by finishing.
                    await changed.wait_for(lambda: running == 0 or room(left))  # noqa: B023 (awaited here)
                if running == 0 and not room(left):
                    for rest in range(i, len(entries)):
                        refuse(rest, _batch_full(used, budget.waiting, budget.limit, False))
                    break
            running += 1
            group.create_task(run(i))
    answered = [p for p in parts if p is not None]
    if not answered:
        return None, False
    return b"[" + b",".join(answered) + b"]", any(errors)
