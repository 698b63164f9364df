"""memory.* over the gateway, and recall of other sessions in the chat prompt."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from gateway.client import Client, RpcError
from gateway.config import Config
from tests.conftest import TOKEN, running
from tests.fake_openai import FakeOpenAI
from tests.gateway.test_chat import run_to_end


def chat_config(factory: Callable[..., Config], fake: FakeOpenAI, **memory: Any) -> Config:
    return factory(
        llm={"base_url": fake.base_url, "api_key": "sk-test", "model": "fake-model",
             "max_retries": 0},
        memory={"debounce_ms": 20, **memory},
    )


async def say(c: Client, key: str, text: str) -> dict[str, Any]:
    run_id = (await c.call("chat.send", {"sessionKey": key, "message": text}))["runId"]
    return (await run_to_end(c, run_id))[1]


async def search_until(c: Client, params: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """memory.search, retried until the debounced indexer has caught up."""
    async with asyncio.timeout(timeout):
        while True:
            result: dict[str, Any] = await c.call("memory.search", params)
            if result["results"]:
                return result
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("embedder", ["none", "openai"])
async def test_a_fact_is_found_after_restart(
    backend_config_factory: Callable[..., Config], fake_openai: FakeOpenAI, embedder: str
) -> None:
    """The seed flow: a fact said in chat is indexed, and after a restart memory.search finds it."""
    cfg = chat_config(backend_config_factory, fake_openai, embedder=embedder)
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        await say(c, key, "My favourite programming language is Rust.")
        await say(c, key, "The weather in Lisbon was sunny today.")
        await search_until(c, {"query": "Lisbon weather"})
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        result = await search_until(c, {"query": "favourite programming language", "k": 3})
        top = result["results"][0]
        assert "Rust" in top["content"] and top["sessionKey"] == key
        assert result["mode"] == ("keyword" if embedder == "none" else "hybrid")
        assert {"chunkId", "score", "lineStart", "lineEnd", "startTs", "endTs"} <= set(top)
        status = await c.call("memory.status")
        assert status["chunks"] >= 1 and status["provider"] == embedder


async def test_recall_block_reaches_the_model(backend_config_factory: Callable[..., Config],
                                              fake_openai: FakeOpenAI) -> None:
    """A new session's prompt carries a delimited, dated block recalled from the user's other
    sessions."""
    cfg = chat_config(backend_config_factory, fake_openai)
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        old = (await c.call("sessions.create"))["sessionKey"]
        await say(c, old, "My favourite programming language is Rust.")
        await search_until(c, {"query": "programming language"})
        new = (await c.call("sessions.create", {"systemPrompt": "You are helpful."}))["sessionKey"]
        final = await say(c, new, "Which programming language do I like?")
        assert final["params"]["recalled"]
        system = fake_openai.chat_requests[-1].json["messages"][0]
        assert system["role"] == "system" and system["content"].startswith("You are helpful.")
        assert ("<recalled_memories>" in system["content"]
                and "</recalled_memories>" in system["content"])
        assert "favourite programming language is Rust" in system["content"]
        assert f"session {old[:8]}" in system["content"]
        # the current session is never recalled into itself
        again = await say(c, new, "Rust, you say?")
        hits = await c.call("memory.search", {"query": "Rust", "k": 50})
        own = {h["chunkId"] for h in hits["results"] if h["sessionKey"] == new}
        assert not own & set(again["params"]["recalled"])


async def test_recall_can_be_turned_off(config_factory: Callable[..., Config],
                                        fake_openai: FakeOpenAI) -> None:
    """With chat.recall = false no memory block is sent and nothing is recalled."""
    cfg = config_factory(llm={"base_url": fake_openai.base_url}, memory={"debounce_ms": 20},
                         chat={"recall": False})
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        old = (await c.call("sessions.create"))["sessionKey"]
        await say(c, old, "My favourite programming language is Rust.")
        await search_until(c, {"query": "programming language"})
        new = (await c.call("sessions.create"))["sessionKey"]
        final = await say(c, new, "Which programming language do I like?")
        assert final["params"]["recalled"] == []
        assert all("recalled_memories" not in m["content"]
                   for m in fake_openai.chat_requests[-1].json["messages"])


async def test_other_users_keys_are_not_found(backend_config_factory: Callable[..., Config],
                                              fake_openai: FakeOpenAI) -> None:
    """memory.search scoped by another user's or a path-like session key answers -32002; hits never
    cross users."""
    users = [{"name": "alice", "token": "alice-token-0123456789"},
             {"name": "bob", "token": "bob-token-0123456789xx"}]
    cfg = backend_config_factory(auth={"users": users, "token": None},
                                 llm={"base_url": fake_openai.base_url}, memory={"debounce_ms": 20})
    async with running(cfg) as app:
        async with Client.connect(app.url, users[0]["token"]) as alice, \
                Client.connect(app.url, users[1]["token"]) as bob:
            key = (await alice.call("sessions.create"))["sessionKey"]
            await say(alice, key, "Alice keeps her secret recipe for lemon cake.")
            await search_until(alice, {"query": "lemon cake"})
            assert (await bob.call("memory.search", {"query": "lemon cake"}))["results"] == []
            for bad in (key, "../../etc/passwd"):
                for field in ("sessionKey", "excludeSessionKey"):
                    with pytest.raises(RpcError) as info:
                        await bob.call("memory.search", {"query": "cake", field: bad})
                    assert info.value.code == -32002


async def test_delete_removes_index_rows(backend_config_factory: Callable[..., Config],
                                         fake_openai: FakeOpenAI) -> None:
    """sessions.delete removes the session's chunks at once."""
    cfg = chat_config(backend_config_factory, fake_openai)
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        await say(c, key, "Remember the blue umbrella.")
        await search_until(c, {"query": "blue umbrella"})
        assert (await c.call("sessions.delete", {"sessionKey": key})) == {"deleted": True}
        assert (await c.call("memory.search", {"query": "blue umbrella"}))["results"] == []


async def test_search_params_are_validated(client: Client) -> None:
    """Bad k, mode or dates are -32602 naming the field."""
    cases: list[tuple[dict[str, Any], str]] = [({"query": "x", "k": 0}, "k"),
                                               ({"query": "x", "mode": "fuzzy"}, "mode"),
                                               ({"query": "x", "after": "yesterday"}, "after")]
    for params, field in cases:
        with pytest.raises(RpcError) as info:
            await client.call("memory.search", params)
        assert info.value.code == -32602 and info.value.data["field"] == field


async def test_reindex_is_queued(client: Client) -> None:
    """memory.reindex answers at once with queued:true."""
    assert await client.call("memory.reindex", {"full": True}) == {"queued": True}
    assert "chunks" in await client.call("memory.status")
