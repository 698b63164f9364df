"""Memory inside a conversation, over the real socket on both storage backends: the index
follows the visible history (an edited or regenerated line leaves it), and a message that left
the prompt's history window is recalled into the same session's prompt."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from gateway.client import Client, RpcError
from gateway.config import Config
from tests.conftest import TOKEN, running
from tests.fake_openai import Behaviour, FakeOpenAI
from tests.gateway.test_chat import run_to_end
from tests.gateway.test_memory_methods import chat_config, say, search_until


async def _resend(c: Client, method: str, params: dict[str, Any], timeout: float = 10.0) -> str:
    """chat.regenerate / chat.edit once the session is idle: on PostgreSQL the run's lease is
    released a moment after its chat.final, and until then the session answers "session busy"
    (-32003: resends run only in an idle session, docs/protocol.md)."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                return str((await c.call(method, params))["runId"])
            except RpcError as exc:
                if exc.code != -32003 or "busy" not in exc.message:
                    raise
                await asyncio.sleep(0.02)


async def _texts(c: Client, query: str) -> list[str]:
    found = await c.call("memory.search", {"query": query, "mode": "keyword", "k": 20})
    return [h["content"] for h in found["results"]]


async def _until_found(c: Client, query: str, needle: str, timeout: float = 10.0) -> list[str]:
    async with asyncio.timeout(timeout):
        while True:
            texts = await _texts(c, query)
            if any(needle in t for t in texts):
                return texts
            await asyncio.sleep(0.05)


async def test_an_edited_away_statement_leaves_the_index(
        backend_config_factory: Callable[..., Config], fake_openai: FakeOpenAI) -> None:
    """After chat.edit, memory.search finds the new text and neither the old message nor the
    reply that answered it, though the transcript still holds both lines."""
    cfg = chat_config(backend_config_factory, fake_openai)
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        await say(c, key, "The weather is mild today.")
        await say(c, key, "My cat is called Tomasz.")
        await _until_found(c, "cat called", "Tomasz")
        run_id = await _resend(c, "chat.edit",
                               {"sessionKey": key, "text": "My cat is called Felix."})
        await run_to_end(c, run_id)
        texts = await _until_found(c, "cat called", "Felix")
        texts = await _texts(c, "cat called Tomasz")
        assert texts and not any("Tomasz" in t for t in texts)
        assert any("weather is mild" in t for t in await _texts(c, "weather mild"))


async def test_a_regenerated_reply_leaves_the_index(
        backend_config_factory: Callable[..., Config], fake_openai: FakeOpenAI) -> None:
    """After chat.regenerate the superseded reply is not found; the new one and the question are."""
    cfg = chat_config(backend_config_factory, fake_openai)
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        fake_openai.script(Behaviour(reply="The capital is Marseille."))
        await say(c, key, "What is the capital of France?")
        await _until_found(c, "capital", "Marseille")
        fake_openai.script(Behaviour(reply="The capital is Paris."))
        run_id = await _resend(c, "chat.regenerate", {"sessionKey": key})
        await run_to_end(c, run_id)
        await _until_found(c, "capital", "Paris")
        texts = await _texts(c, "capital Marseille")
        assert not any("Marseille" in t for t in texts)
        assert any("capital of France" in t for t in texts)


def _system(request: dict[str, Any]) -> str:
    return next((m["content"] for m in request["messages"] if m["role"] == "system"), "")


async def test_a_fact_forty_messages_back_reaches_the_prompt(
        backend_config_factory: Callable[..., Config], fake_openai: FakeOpenAI) -> None:
    """A statement that left the history window (20 messages) is recalled into the same
    session's prompt, marked as earlier in this conversation; what the window holds is not
    recalled again."""
    cfg = chat_config(backend_config_factory, fake_openai)
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        await say(c, key, "My storage locker combination is 4471-2963.")
        for i in range(20):
            await say(c, key, f"Tell me something about topic number {i} please.")
        await search_until(c, {"query": "topic number 19", "mode": "keyword"})
        await _until_found(c, "locker combination", "4471")
        question = "What is my storage locker combination?"
        await say(c, key, question)
        # The reply's own request (an episode's summary request may come after it).
        asked = [r.json for r in fake_openai.chat_requests
                 if r.json["messages"][-1]["content"] == question]
        system = _system(asked[-1])
        assert "4471-2963" in system
        assert "earlier in this conversation" in system
        # The window's own messages are in the history, not repeated in the recall block.
        assert "topic number 19" not in system


async def test_a_short_follow_up_recalls_with_the_previous_turn(
        backend_config_factory: Callable[..., Config], fake_openai: FakeOpenAI) -> None:
    """"and where?" alone shares no word with the old session; searched with the previous user
    message and its reply's first sentence, it recalls the excerpt about the wedding."""
    cfg = chat_config(backend_config_factory, fake_openai)
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        old = (await c.call("sessions.create"))["sessionKey"]
        await say(c, old, "My sister Maria is getting married in Porto in June.")
        await _until_found(c, "sister Maria", "Porto")
        new = (await c.call("sessions.create"))["sessionKey"]
        await say(c, new, "Let's talk about my sister Maria's wedding.")
        final = await say(c, new, "and where?")
        asked = [r.json for r in fake_openai.chat_requests
                 if r.json["messages"][-1]["content"] == "and where?"]
        assert "Porto" in _system(asked[-1])
        assert final["params"]["recalled"]


async def test_regenerations_do_not_shrink_the_history_window(
        backend_config_factory: Callable[..., Config], fake_openai: FakeOpenAI) -> None:
    """The prompt holds chat.history_limit shown messages however many superseded replies lie
    between them: the window is counted after they are left out."""
    cfg = backend_config_factory(llm={"base_url": fake_openai.base_url, "api_key": "sk-test",
                                      "model": "fake-model", "max_retries": 0},
                                 chat={"history_limit": 4, "max_queued_runs": 1})
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        for text in ("first question", "second question", "third question"):
            await say(c, key, text)
        for _ in range(3):
            await run_to_end(c, await _resend(c, "chat.regenerate", {"sessionKey": key}))
        await say(c, key, "fourth question")
        asked = [r.json for r in fake_openai.chat_requests
                 if r.json["messages"][-1]["content"] == "fourth question"]
        sent = [m["content"] for m in asked[-1]["messages"] if m["role"] != "system"]
        assert sent == ["Echo: second question", "third question", "Echo: third question",
                        "fourth question"]


async def test_a_regenerated_long_reply_leaves_the_index_whole(
        backend_config_factory: Callable[..., Config], fake_openai: FakeOpenAI) -> None:
    """A reply long enough to be cut into segments across chunks, regenerated: no chunk keeps
    any of the old reply, and the new one is indexed from its first word to its last."""
    cfg = chat_config(backend_config_factory, fake_openai, chunk_tokens=64, overlap_tokens=16)
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        fake_openai.script(Behaviour(reply="Marseille opens it. " + "alpha " * 150
                                     + "Toulon closes it."))
        await say(c, key, "Describe the coast.")
        await _until_found(c, "Toulon", "Toulon")
        fake_openai.script(Behaviour(reply="Paris opens it. " + "beta " * 150 + "Lyon closes it."))
        await run_to_end(c, await _resend(c, "chat.regenerate", {"sessionKey": key}))
        await _until_found(c, "Lyon", "Lyon")
        await _until_found(c, "Paris", "Paris")
        for gone in ("Marseille", "Toulon", "alpha"):
            assert not any(gone in t for t in await _texts(c, gone)), gone
