"""A batch frame run within the connection's reply budget (:mod:`gateway.rpc.budget`). No I/O.

The entries of a batch run concurrently, as JSON-RPC allows, but each is encoded as soon as it
is answered, and its bytes count against the budget at once, beside the connection's other
replies (``limits.max_reply_bytes``):

- an entry starts only while the bytes held, plus ``reserve`` for it and for each call still
  running, fit the budget (``reserve`` is the most one page of a listing method builds, so
  entries that each return a big page run a few at a time, not all at once); the first entry
  starts once nothing else is running, as a single call would;
- when the next entry cannot fit and nothing is left running, it and every later entry answer
  -32004 without running (a notification among them is dropped, it is owed nothing);
- an entry that ran but whose reply does not fit answers the budget error in its place.

So what one frame builds is bounded by its budget plus the few pages in flight, however many
entries it holds, and what it did build is never encoded twice. Room for an error answer is
held for every entry not yet answered, so refusals never take the array past the budget.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson

from gateway.errors import GatewayError, RateLimited
from gateway.rpc.budget import RETRY_AFTER_MS, ReplyBudget, over_budget
from gateway.rpc.context import Reply

__all__ = ["run_batch"]

# An error entry without its id: the envelope and the longest message below, with room to spare.
_ERROR_BYTES = 400


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
    one: Callable[[Any], Awaitable[Reply | None]],
    budget: ReplyBudget | None,
    reserve: int,
) -> Reply | None:
    """The encoded array answering ``entries`` (None when nothing is owed), its bytes held in
    ``budget`` (None: no limit). ``one`` answers an entry, encoded."""
    if budget is None:
        budget = ReplyBudget(sys.maxsize)
    parts: list[bytes | None] = [None] * len(entries)
    errors = [False] * len(entries)
    error_room = [_error_room(entry) for entry in entries]
    used = 1  # "[" ; each part adds its bytes and one "," or "]"
    pending = sum(error_room)
    budget.hold(used + pending)

    def waiting() -> int:
        return budget.held - used - pending

    def settle(i: int, data: bytes | None, is_error: bool) -> None:
        nonlocal used, pending
        pending -= error_room[i]
        grown = -error_room[i]
        if data is not None:
            parts[i], errors[i] = data, is_error
            used += len(data) + 1
            grown += len(data) + 1
        budget.hold(grown)

    def refuse(i: int, error: GatewayError) -> None:
        owed, req_id = _entry_id(entries[i])
        data = (orjson.dumps({"jsonrpc": "2.0", "id": req_id, "error": error.to_object()}) if owed
                else None)
        settle(i, data, True)

    # Entries handed room whose task has not run yet: a task cancelled before its first step
    # never runs its finally, so their room is given back after the group instead.
    unstarted = 0

    async def run(i: int) -> None:
        nonlocal unstarted
        unstarted -= 1
        try:
            reply = await one(entries[i])
            if reply is None:
                settle(i, None, False)
            elif budget.fits(len(reply.data) + 1 - error_room[i]):
                settle(i, reply.data, reply.is_error)
            elif len(reply.data) + 2 > budget.limit:  # even alone in "[…]" it could not fit
                refuse(i, over_budget(len(reply.data) + 2, waiting(), budget.limit))
            else:
                refuse(i, _batch_full(used, waiting(), budget.limit, True))
        finally:
            budget.finish(reserve)

    try:
        async with asyncio.TaskGroup() as group:
            for i in range(len(entries)):
                if not await budget.start(reserve, first=i == 0):
                    for rest in range(i, len(entries)):
                        refuse(rest, _batch_full(used, waiting(), budget.limit, False))
                    break
                unstarted += 1
                group.create_task(run(i))
    except BaseException:
        budget.release(used + pending)  # nothing of this frame will be sent
        raise
    finally:
        for _ in range(unstarted):
            budget.finish(reserve)
    answered = [p for p in parts if p is not None]
    if not answered:
        budget.release(used)
        return None
    return Reply(b"[" + b",".join(answered) + b"]", any(errors))
