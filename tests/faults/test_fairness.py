"""One user's flood cannot starve another: at most limits.max_user_running calls of a user run
at once across all of their connections, at most limits.max_user_threads of their jobs are in
the worker threads at once, the rest wait their turn, and another user's calls never wait
behind them (issue 22, t16; bench.attacks measures the latency)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import AsyncExitStack

import orjson

from gateway.client import Client
from gateway.config import Config
from gateway.rpc import CALLER, FairThreads, UserSlots, fair_threads
from tests.conftest import TOKEN, running
from tests.fake_openai import FakeOpenAI
from tests.gateway.test_memory_methods import say

ALICE, BOB = "alice-token-0123456789", "bob-token-0123456789xx"


def _bob_queries(fake: FakeOpenAI) -> int:
    return sum(1 for r in list(fake.requests)
               if r.path == "/v1/embeddings" and "bob asks" in orjson.dumps(r.json).decode())


async def test_a_users_calls_beyond_the_cap_wait_and_others_go_first(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """Bob sends six memory.search over three connections while the embeddings endpoint never
    answers: only two (limits.max_user_running) reach it, the others wait, and alice's calls
    (on the same worker threads) are answered meanwhile; bob's waiting calls go when he leaves."""
    cfg = config_factory(
        auth={"users": [{"name": "alice", "token": ALICE}, {"name": "bob", "token": BOB}],
              "token": None},
        llm={"base_url": fake_openai.base_url, "api_key": "sk-t", "model": "fake-model",
             "max_retries": 0},
        memory={"embedder": "openai", "debounce_ms": 20}, quotas={"max_searches_per_user": 50},
        limits={"max_user_running": 2})
    async with running(cfg) as app, Client.connect(app.url, ALICE) as alice:
        key = (await alice.call("sessions.create", {"title": "mine"}))["sessionKey"]
        await say(alice, key, "my dog is called Rex")
        async with asyncio.timeout(10):  # vectors are built: searches embed their query
            while not (await alice.call("memory.status"))["vectorSearch"]["ready"]:
                await asyncio.sleep(0.02)
        fake_openai.configure_embeddings(hang=True)
        async with AsyncExitStack() as stack:
            bobs = [await stack.enter_async_context(Client.connect(app.url, BOB)) for _ in range(3)]
            for i, bob in enumerate(bobs * 2):
                await bob.ws.send(orjson.dumps({"id": f"s{i}", "method": "memory.search",
                                                "params": {"query": f"bob asks {i}"}}).decode())
            async with asyncio.timeout(10):
                while _bob_queries(fake_openai) < 2:
                    await asyncio.sleep(0.01)
            for _ in range(5):
                assert [s["title"] for s in (await alice.call("sessions.list"))["sessions"]] == [
                    "mine"]
                key = (await alice.call("sessions.create", {"title": "more"}))["sessionKey"]
                await alice.call("sessions.delete", {"sessionKey": key})
            assert _bob_queries(fake_openai) == 2
        assert (await alice.call("gateway.health"))["status"] == "ok"


async def test_a_cancelled_waiter_passes_its_slot_on() -> None:
    """A call cancelled while it waits for a slot (its connection closed), even one handed the
    slot at that moment, never keeps it: the next waiter gets it, and an idle user leaves no
    entry behind."""
    slots = UserSlots(1)
    await slots.enter("bob")
    second = asyncio.create_task(slots.enter("bob"))
    third = asyncio.create_task(slots.enter("bob"))
    await asyncio.sleep(0)
    slots.leave("bob")  # hands the slot to the second...
    second.cancel()  # ...which is cancelled before it runs
    with contextlib.suppress(asyncio.CancelledError):
        await second
    await asyncio.wait_for(third, 5)
    assert slots.running("bob") == 1
    fourth = asyncio.create_task(slots.enter("bob"))
    await asyncio.sleep(0)
    fourth.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await fourth
    slots.leave("bob")
    assert slots.running("bob") == 0 and not slots._lanes


async def test_a_users_jobs_beyond_the_thread_share_wait_and_others_go_first() -> None:
    """Bob has two jobs stuck in the worker threads (limits.max_user_threads 2) and a third
    waiting: alice's job, sent after it, runs and finishes while bob's third has not started;
    bob's third starts as soon as one of his own ends, and a job of his cancelled while it
    waited never runs."""
    pool = FairThreads(per_user=2, max_workers=4)
    release = threading.Event()
    started: list[str] = []

    def job(name: str, block: bool) -> str:
        started.append(name)
        if block:
            release.wait(10)
        return name

    def submit(user: str, name: str, block: bool) -> Future[str]:
        token = CALLER.set(user)
        try:
            return pool.submit(job, name, block)
        finally:
            CALLER.reset(token)

    try:
        bob = [submit("bob", f"bob{i}", True) for i in range(2)]
        bob_third = submit("bob", "bob2", False)
        bob_cancelled = submit("bob", "bob3", False)
        assert await asyncio.wait_for(asyncio.wrap_future(submit("alice", "alice", False)),
                                      10) == "alice"
        assert "bob2" not in started and pool.running("bob") == 2
        assert bob_cancelled.cancel()  # still waiting for bob's turn: it never runs
        release.set()
        assert await asyncio.wait_for(
            asyncio.gather(*map(asyncio.wrap_future, [*bob, bob_third])), 10
        ) == ["bob0", "bob1", "bob2"]
        assert "bob3" not in started
    finally:
        release.set()
        pool.shutdown(wait=True)
    # A job's turn passes on just after its result is set: counted once the threads are done.
    assert pool.running("bob") == 0 and pool.running("alice") == 0


async def test_the_daemons_blocking_work_runs_in_the_fair_threads(
    config_factory: Callable[..., Config]
) -> None:
    """A running gateway makes its loop's worker threads a FairThreads of
    limits.max_user_threads, so the store's jobs of every call take their user's turn."""
    async with running(config_factory(limits={"max_user_threads": 3})) as app, \
            Client.connect(app.url, TOKEN) as c:
        assert (await c.call("sessions.list"))["sessions"] == []
        name = await asyncio.to_thread(lambda: threading.current_thread().name)
        assert name.startswith("recalld-worker"), name
        assert fair_threads(3).per_user == 3
