"""How the reply budget hands freed room to waiting calls, driven on the budget objects directly
(no timing): in arrival order across all of a user's connections, ahead of a call that arrives
as the room is freed; and how room is given back: every byte to the user's budget when a
connection closes with calls waiting, and a batch's room when one of its entries raises."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.rpc import ReplyBudget, UserBudgets
from gateway.rpc.batch import run_batch

PAGE = 8 * 1024 * 1024  # a call's reservation: the history page cap


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def _waiting(budget: ReplyBudget, order: list[str], name: str) -> asyncio.Task[None]:
    async def call() -> None:
        assert await budget.start_call(PAGE)
        order.append(name)

    return asyncio.create_task(call())


async def test_room_freed_on_one_connection_goes_to_the_users_earliest_waiter() -> None:
    """Bob's connections a and c fill his budget and each queue more calls after b's one call
    is already waiting: the room a's finished call frees goes to b's call first, then the
    calls start in the order they arrived, whichever connection frees the room."""
    users = UserBudgets(2 * PAGE)
    a, b, c = ReplyBudget(8 * PAGE), ReplyBudget(8 * PAGE), ReplyBudget(8 * PAGE)
    for budget in (a, b, c):
        users.join("bob", budget)
    assert await a.start_call(PAGE)
    assert await c.start_call(PAGE)
    order: list[str] = []
    tasks = [_waiting(b, order, "b0")]
    await _turns()
    tasks += [_waiting(a, order, "a0"), _waiting(a, order, "a1"), _waiting(c, order, "c0")]
    await _turns()
    assert order == []

    a.finish(PAGE)
    await _turns()
    assert order == ["b0"]
    b.finish(PAGE)
    await _turns()
    assert order == ["b0", "a0"]
    a.finish(PAGE)
    await _turns()
    assert order == ["b0", "a0", "a1"]
    c.finish(PAGE)
    await _turns()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert order == ["b0", "a0", "a1", "c0"]


async def test_a_call_arriving_as_room_is_freed_waits_behind_the_call_already_waiting() -> None:
    """A call that arrives in the same turn as a running call finishes does not take the room
    the finished call hands to the call that was already waiting: it waits its own turn."""
    budget = ReplyBudget(PAGE)
    assert await budget.start_call(PAGE)
    order: list[str] = []
    earlier = _waiting(budget, order, "earlier")
    await _turns()
    later = _waiting(budget, order, "later")  # its first step runs before the hand-off
    budget.finish(PAGE)
    await _turns()
    assert order == ["earlier"]
    budget.finish(PAGE)
    await asyncio.wait_for(asyncio.gather(earlier, later), 5)
    assert order == ["earlier", "later"]
    budget.finish(PAGE)
    assert budget.running == budget.reserved == 0


async def test_calls_refused_as_the_last_call_finishes_stay_refused_when_the_client_reads() -> None:
    """Ten calls wait behind a running call and an unread reply that leaves no room: when the
    running call finishes they are refused, and the client reading its reply before they
    resume does not let them all start at once past the budget's room."""
    budget = ReplyBudget(4 * PAGE)
    assert await budget.start_call(PAGE)
    budget.hold(3 * PAGE + 1)  # a reply built by another call, not read yet
    results: list[bool] = []

    async def call() -> None:
        results.append(await budget.start_call(PAGE))

    tasks = [asyncio.create_task(call()) for _ in range(10)]
    await _turns()
    budget.finish(PAGE)
    await asyncio.sleep(0)  # the hand-off refuses them all...
    budget.release(3 * PAGE + 1)  # ...and the client reads before they resume
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert results == [False] * 10
    assert budget.running == budget.reserved == 0


async def test_a_connection_closed_with_calls_waiting_gives_the_user_budget_every_byte() -> None:
    """Bob's connection a closes with one call running, two single calls and a batch's entries
    waiting, and replies held unread: once its tasks are cancelled and it leaves, nothing of it
    stays counted in bob's budget, and the call his connection b had waiting starts."""
    users = UserBudgets(5 * PAGE)
    a, b = ReplyBudget(4 * PAGE), ReplyBudget(4 * PAGE)
    users.join("bob", a)
    users.join("bob", b)
    shared = b.shared
    assert shared is not None
    a.hold(1000)  # a reply the client has not read
    assert await a.start_call(PAGE)
    gate = asyncio.Event()

    async def entry(message: Any) -> None:
        await gate.wait()

    batch = asyncio.create_task(run_batch([{"id": i} for i in range(6)], entry, a, PAGE))
    await _turns()
    assert a.running == 3  # the call and two entries; the batch waits for room for the third
    order: list[str] = []
    singles = [_waiting(a, order, "a0"), _waiting(a, order, "a1")]
    await _turns()
    assert await b.start_call(PAGE)
    theirs = _waiting(b, order, "b0")
    await _turns()
    assert order == [] and shared.running == 4

    for task in [batch, *singles]:  # the server cancels a closed connection's tasks...
        task.cancel()
    await asyncio.gather(batch, *singles, return_exceptions=True)
    a.finish(PAGE)  # ...and the running call's own finally gives back its reservation
    assert shared.held == a.held == 1000  # the unread reply; the cancelled batch let its bytes go
    users.leave("bob", a)
    await asyncio.wait_for(theirs, 5)
    assert order == ["b0"]
    assert (shared.running, shared.reserved, shared.held) == (2, 2 * PAGE, 0)
    b.finish(PAGE)
    b.finish(PAGE)
    assert (shared.running, shared.reserved, shared.held) == (0, 0, 0)


async def test_a_batch_entry_that_raises_leaves_no_room_counted_for_entries_never_run() -> None:
    """A batch entry raises (a bug that escaped its call) in the turn the next entry is handed
    room: the batch fails, every entry handed room gives it back, the one cancelled before it
    ran included, and the bytes held for the array that will not be sent are let go, so the
    connection's later calls are neither left waiting nor refused on their account."""
    budget = ReplyBudget(2 * PAGE + 2000)  # two entries run, the third waits for room
    go = asyncio.Event()

    async def entry(message: Any) -> None:
        if message["id"] == 0:
            await asyncio.sleep(0)
            asyncio.get_running_loop().call_soon(go.set)  # entry 1 resumes as entry 2 starts
        elif message["id"] == 1:
            await go.wait()
            raise RuntimeError("a bug escaping the entry")
        else:
            await asyncio.sleep(0)

    with pytest.raises(ExceptionGroup):
        await run_batch([{"id": i} for i in range(4)], entry, budget, PAGE)
    assert budget.running == budget.reserved == budget.held == 0
