"""Incognito sessions (sessions.create {memory:false}) and per-message recall:false."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.client import Client
from gateway.config import Config
from tests.conftest import TOKEN, running
from tests.fake_openai import Behaviour, FakeOpenAI
from tests.gateway.test_chat import run_to_end
from tests.gateway.test_memory_methods import chat_config, say, search_until


async def test_incognito_session_is_kept_but_never_indexed_or_remembered(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """An incognito session's transcript is kept, its words are never searchable (not after a
    sync, a full reindex or a restart), its prompt has no recall and it is offered no
    memory tools."""
    cfg = chat_config(config_factory, fake_openai)
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        normal = (await c.call("sessions.create"))["sessionKey"]
        await say(c, normal, "The marmalade recipe uses Seville oranges.")
        await search_until(c, {"query": "marmalade"})
        created = await c.call("sessions.create", {"memory": False})
        assert created["memory"] is False
        secret = created["sessionKey"]
        assert (await c.call("sessions.get", {"sessionKey": secret}))["memory"] is False
        fake_openai.script(Behaviour(reply="ok",
                                     tool_calls=[("remember", {"text": "I like marmalade"})]))
        final = await say(c, secret, "My secret password hint is zanzibar, and marmalade?")
        assert "facts" not in final["params"] and final["params"]["recalled"] == []
        sent = fake_openai.chat_requests[-1].json
        assert "tools" not in sent
        assert all("<recalled_memories>" not in m["content"] for m in sent["messages"])
        history = (await c.call("sessions.history", {"sessionKey": secret}))["messages"]
        assert len(history) == 2
        await c.call("memory.reindex", {"full": True})
        await say(c, normal, "one more line to make the indexer run")
        await search_until(c, {"query": "indexer run"})
        assert (await c.call("memory.search", {"query": "zanzibar"}))["results"] == []
        assert (await c.call("memory.facts.list"))["facts"] == []
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        await search_until(c, {"query": "marmalade recipe"})
        await asyncio.sleep(0.2)
        assert (await c.call("memory.search", {"query": "zanzibar"}))["results"] == []
        assert (await c.call("sessions.get", {"sessionKey": secret}))["memory"] is False


async def test_recall_false_skips_recall_for_one_message(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """chat.send {recall:false} leaves the recall block out of that run only; the next
    run has it."""
    async with running(chat_config(config_factory, fake_openai)) as app, \
            Client.connect(app.url, TOKEN) as c:
        old = (await c.call("sessions.create"))["sessionKey"]
        await say(c, old, "My favourite programming language is Rust.")
        await search_until(c, {"query": "programming language"})
        new = (await c.call("sessions.create"))["sessionKey"]
        run = await c.call("chat.send",
                           {"sessionKey": new, "message": "Which programming language do I like?",
                            "recall": False})
        final = (await run_to_end(c, run["runId"]))[1]
        assert final["params"]["recalled"] == []
        assert ("<recalled_memories>"
                not in fake_openai.chat_requests[-1].json["messages"][0]["content"])
        again = await say(c, new, "Which programming language do I like?")
        assert again["params"]["recalled"]
