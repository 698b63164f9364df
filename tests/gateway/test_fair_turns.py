"""What another user's call finds ahead of it while one user floods (issue 22, t16), counted,
never timed: a flooding user's waiting calls are not run while they wait (a call that finishes
hands its room in the reply budget to the waiting calls that fit, where it used to wake them
all, and alice's call waited behind those wake-ups in the event loop), and by default one job
of each user is in the worker threads (a second only queued on the store's index lock)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Generator
from typing import Any

from gateway.config import Config
from gateway.rpc import CALLER, FairThreads, ReplyBudget, UserBudgets
from tests.conftest import running

PAGE = 8 * 1024 * 1024  # a call's reservation: the history page cap


class Stepped(Coroutine[Any, Any, Any]):
    """A coroutine that counts how often its task resumes it."""

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self._coro = coro
        self.steps = 0

    def send(self, value: Any) -> Any:
        self.steps += 1
        return self._coro.send(value)

    def throw(self, *exc: Any) -> Any:
        self.steps += 1
        return self._coro.throw(*exc)

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, None, Any]:
        raise NotImplementedError  # run only as a task's coroutine


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_finished_call_resumes_only_the_waiter_that_takes_its_room() -> None:
    """Bob's four connections run eight calls (his shared budget's room) and fifty more wait:
    each call that finishes resumes exactly one waiting call, which starts; the other waiting
    calls are not run at all until their turn, and they start in arrival order."""
    users = UserBudgets(8 * PAGE)
    conns = [ReplyBudget(32 * PAGE) for _ in range(4)]
    for budget in conns:
        users.join("bob", budget)
    for i in range(8):
        assert await conns[i % 4].start_call(PAGE)
    started: list[int] = []

    async def call(i: int) -> None:
        assert await conns[i % 4].start_call(PAGE)
        started.append(i)

    waiting = [Stepped(call(i)) for i in range(50)]
    tasks = [asyncio.create_task(w) for w in waiting]
    await _turns()
    assert [w.steps for w in waiting] == [1] * 50 and not started

    for done in range(3):
        conns[done % 4].finish(PAGE)
        await _turns()
        assert started == list(range(done + 1))
        assert [w.steps for w in waiting[done + 1:]] == [1] * (49 - done)

    for budget in conns:  # bob leaves: his calls still running are counted out, the rest start
        users.leave("bob", budget)
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert sorted(started) == list(range(50))


async def test_a_waiter_cancelled_after_it_was_handed_room_passes_the_room_on() -> None:
    """A waiting call handed room just as its connection closed never keeps it: the next waiter
    starts in its place, and nothing stays counted once every call is done."""
    budget = ReplyBudget(PAGE)
    assert await budget.start_call(PAGE)
    second = asyncio.create_task(budget.start_call(PAGE))
    third = asyncio.create_task(budget.start_call(PAGE))
    await _turns()
    budget.finish(PAGE)
    await asyncio.sleep(0)  # the room is handed to the second...
    second.cancel()  # ...which is cancelled before it runs
    await asyncio.gather(second, return_exceptions=True)
    assert await asyncio.wait_for(third, 5)
    assert budget.running == 1 and budget.reserved == PAGE
    budget.finish(PAGE)
    assert budget.running == 0 and budget.reserved == 0


async def test_by_default_a_users_second_job_waits_and_another_users_goes_first(
    config_factory: Callable[..., Config]
) -> None:
    """With the default limits, bob's second job waits while his first is in a worker thread,
    alice's job (sent after it) runs meanwhile, and bob's second runs once his first ends."""
    async with running(config_factory()):
        loop = asyncio.get_running_loop()
        pool = loop._default_executor  # type: ignore[attr-defined]  # the app's FairThreads
        assert isinstance(pool, FairThreads)
        release = threading.Event()
        started: list[str] = []

        def job(name: str, block: bool) -> str:
            started.append(name)
            if block:
                release.wait(10)
            return name

        def submit(user: str, name: str, block: bool) -> asyncio.Future[str]:
            token = CALLER.set(user)
            try:
                return loop.run_in_executor(None, job, name, block)
            finally:
                CALLER.reset(token)

        try:
            bob = [submit("bob", "bob0", True), submit("bob", "bob1", False)]
            assert pool.running("bob") == 1
            assert await asyncio.wait_for(submit("alice", "alice", False), 10) == "alice"
            assert "bob1" not in started
        finally:
            release.set()
        assert await asyncio.wait_for(asyncio.gather(*bob), 10) == ["bob0", "bob1"]
