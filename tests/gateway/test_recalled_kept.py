"""The chunks recalled into a reply are kept with it: its transcript line and sessions.history
carry their references, the ids chat.final announced, on both storage backends."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.client import Client
from gateway.config import Config
from tests.conftest import TOKEN, running
from tests.fake_openai import FakeOpenAI
from tests.gateway.test_memory_methods import chat_config, say, search_until


async def test_recalled_ids_are_in_the_replys_transcript_entry(
        backend_config_factory: Callable[..., Config], fake_openai: FakeOpenAI) -> None:
    """The assistant message of a reply with recall lists each recalled chunk's id, session and
    lines, as history returns it after the fact; a reply without recall has no such key."""
    cfg = chat_config(backend_config_factory, fake_openai)
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        old = (await c.call("sessions.create"))["sessionKey"]
        first = await say(c, old, "My favourite programming language is Rust.")
        assert "recalled" not in first["params"]["message"]
        found = await search_until(c, {"query": "programming language"})
        # The indexer may see the message before its reply; recall once the chunk holds both,
        # or the reference (taken when recalled) names fewer lines than the chunk later does.
        async with asyncio.timeout(10):
            while not any(h["lineEnd"] > h["lineStart"] for h in found["results"]):
                await asyncio.sleep(0.05)
                found = await search_until(c, {"query": "programming language"})
        new = (await c.call("sessions.create"))["sessionKey"]
        final = await say(c, new, "Which programming language do I like?")
        ids = final["params"]["recalled"]
        assert ids and [r["chunkId"] for r in final["params"]["message"]["recalled"]] == ids
        history = (await c.call("sessions.history", {"sessionKey": new}))["messages"]
        refs = history[-1]["recalled"]
        assert [r["chunkId"] for r in refs] == ids
        assert found["results"]
        hit = next(h for h in (await c.call("memory.search",
                                            {"query": "programming language", "k": 50}))["results"]
                   if h["chunkId"] == ids[0])
        assert refs[0] == {"chunkId": hit["chunkId"], "sessionKey": old,
                           "lineStart": hit["lineStart"], "lineEnd": hit["lineEnd"],
                           "startTs": hit["startTs"]}
        assert "recalled" not in history[0]
