"""One user's flood cannot starve another: at most limits.max_user_running calls of a user run
at once across all of their connections, the rest wait their turn, and another user's calls
never wait behind them (issue 22, t16; bench.attacks measures the latency)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from contextlib import AsyncExitStack

import orjson

from gateway.client import Client
from gateway.config import Config
from gateway.rpc import UserSlots
from tests.conftest import running
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
        auth={"users": [{"name": "alice", "token": ALICE}, {"name": "bob", "token": BOB}], "token": None},
        llm={"base_url": fake_openai.base_url, "api_key": "sk-t", "model": "fake-model", "max_retries": 0},
        memory={"embedder": "openai", "debounce_ms": 20}, quotas={"max_searches_per_user": 50}, limits={"max_user_running": 2})
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
                assert [s["title"] for s in (await alice.call("sessions.list"))["sessions"]] == ["mine"]
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
