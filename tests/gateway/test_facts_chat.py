"""Memory tools in a chat run: remember/forget/search_memory called mid-stream through the
real SDK."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from gateway.client import Client
from gateway.config import Config
from tests.conftest import TOKEN, running
from tests.fake_openai import Behaviour, FakeOpenAI
from tests.gateway.test_memory_methods import chat_config, say, search_until


def tool_messages(request: Any) -> list[dict[str, Any]]:
    return [m for m in request.json["messages"] if m["role"] == "tool"]


async def test_a_fact_is_saved_mid_stream(backend_config_factory: Callable[..., Config],
                                          fake_openai: FakeOpenAI) -> None:
    """The model's remember call is executed, its result sent back, the reply continues, and
    chat.final lists the saved fact, which memory.facts.list then shows with its session."""
    fake_openai.script(Behaviour(reply="Let me note that. ",
                                 tool_calls=[("remember", {"text": "My cat is called Luna"})]),
                       Behaviour(reply="Noted: Luna."))
    async with running(chat_config(backend_config_factory, fake_openai)) as app, \
            Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        final = await say(c, key, "My cat is called Luna.")
        assert final["params"]["message"]["content"] == "Let me note that. Noted: Luna."
        facts = final["params"]["facts"]
        assert ([(f["action"], f["fact"]["text"]) for f in facts]
                == [("added", "My cat is called Luna")])
        first, second = fake_openai.chat_requests[-2:]
        assert [t["function"]["name"] for t in first.json["tools"]] == ["remember", "forget",
                                                                        "search_memory"]
        assert "Memory tools:" in first.json["messages"][0]["content"]
        calls = [m for m in second.json["messages"] if m.get("tool_calls")]
        assert calls and calls[0]["tool_calls"][0]["function"]["name"] == "remember"
        result = json.loads(tool_messages(second)[0]["content"])
        assert result == {"ok": True, "action": "added", "id": facts[0]["fact"]["id"]}
        assert tool_messages(second)[0]["tool_call_id"] == calls[0]["tool_calls"][0]["id"]
        listed = (await c.call("memory.facts.list"))["facts"]
        assert [(f["text"], f["sessionKey"]) for f in listed] == [("My cat is called Luna", key)]


async def test_duplicate_is_merged_and_correction_replaces(
    backend_config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """A repeated fact is not stored twice, a near-duplicate updates the fact, and the prompt
    lists facts with ids so a correction can name what it replaces."""
    cfg = chat_config(backend_config_factory, fake_openai, embedder="openai",
                      facts_dedup_threshold=0.8)
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        luna = (await c.call("memory.facts.add",
                             {"text": "My daughter Luna is 3 years old"}))["fact"]
        fake_openai.script(
            Behaviour(reply="",
                      tool_calls=[("remember", {"text": "my daughter luna is 3 years old."})]),
            Behaviour(reply="ok"),
            Behaviour(reply="",
                      tool_calls=[("remember", {"text": "My daughter Luna is 3 years old now"})]),
            Behaviour(reply="ok"))
        same = await say(c, key, "Luna is three.")
        assert same["params"]["facts"][0]["action"] == "unchanged"
        near = await say(c, key, "Luna is three now.")
        merged = near["params"]["facts"][0]
        assert merged["action"] == "updated" and merged["previousId"] == luna["id"]
        current = merged["fact"]["id"]
        fake_openai.script(Behaviour(reply="", tool_calls=[("remember", {"text": "Luna turned 4",
                                                                         "replaces": current})]),
                           Behaviour(reply="Happy birthday, Luna!"))
        fixed = (await say(c, key, "Luna turned 4 yesterday!"))["params"]["facts"][0]
        assert fixed["action"] == "replaced" and fixed["previousId"] == current
        # The correction run's prompt listed the fact it replaced, with its id.
        system = fake_openai.chat_requests[-2].json["messages"][0]["content"]
        section = system.split("<remembered_facts>")[1]
        assert (f'[{current}] "My daughter Luna is 3 years old now"' in section
                and f"[{luna['id']}]" not in section)
        active = (await c.call("memory.facts.list"))["facts"]
        assert [f["text"] for f in active] == ["Luna turned 4"]
        assert len((await c.call("memory.facts.list", {"includeInactive": True}))["facts"]) == 3


async def test_forget_tool_removes_the_fact(config_factory: Callable[..., Config],
                                            fake_openai: FakeOpenAI) -> None:
    """A forget call deletes the named fact and chat.final reports it deleted."""
    async with running(chat_config(config_factory, fake_openai)) as app, \
            Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        fact = (await c.call("memory.facts.add", {"text": "I work at Acme"}))["fact"]
        fake_openai.script(Behaviour(reply="", tool_calls=[("forget", {"id": fact["id"]})]),
                           Behaviour(reply="Forgotten."))
        final = await say(c, key, "Forget where I work.")
        assert ([(f["action"], f["fact"]["id"]) for f in final["params"]["facts"]]
                == [("deleted", fact["id"])])
        assert (await c.call("memory.facts.list"))["facts"] == []


async def test_a_model_that_ignores_or_rejects_tools_still_replies(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """A plain reply saves nothing; a model answering 400 to tools is asked again without them."""
    async with running(chat_config(config_factory, fake_openai)) as app, \
            Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        plain = await say(c, key, "My dog is called Rex.")
        assert (plain["params"]["message"]["content"] == "Echo: My dog is called Rex."
                and "facts" not in plain["params"])
        fake_openai.configure(reject_tools=True)
        final = await say(c, key, "Hello again")
        assert (final["method"] == "chat.final"
                and final["params"]["message"]["content"] == "Echo: Hello again")
        assert "tools" not in fake_openai.chat_requests[-1].json
        assert (await c.call("memory.facts.list"))["facts"] == []


async def test_bad_tool_arguments_and_endless_tool_calls_end_in_text(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """Unparsable arguments come back to the model as an error result, and a model that keeps
    calling tools is asked without tools after chat.max_tool_rounds, so the run ends in text."""
    cfg = chat_config(config_factory, fake_openai)
    cfg = dataclasses.replace(cfg, chat=dataclasses.replace(cfg.chat, max_tool_rounds=2))
    fake_openai.configure(reply="done", tool_calls=[("remember", "{not json")])
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        final = await say(c, key, "hi")
        assert (final["method"] == "chat.final"
                and final["params"]["message"]["content"].endswith("done"))
        requests = fake_openai.chat_requests
        assert ["tools" in r.json for r in requests] == [True, True, False]
        error = json.loads(tool_messages(requests[-1])[0]["content"])
        assert error["ok"] is False and "bad arguments" in error["error"]
        assert (await c.call("memory.facts.list"))["facts"] == []


async def test_search_memory_results_are_quoted_and_listed(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """search_memory's finds reach the model inside the recall block's fences, and chat.final
    lists the query with the chunk ids it found."""
    async with running(chat_config(config_factory, fake_openai)) as app, \
            Client.connect(app.url, TOKEN) as c:
        old = (await c.call("sessions.create"))["sessionKey"]
        await say(c, old, "We planned the trip to Kyoto for April.")
        await search_until(c, {"query": "Kyoto trip"})
        new = (await c.call("sessions.create"))["sessionKey"]
        fake_openai.script(Behaviour(reply="",
                                     tool_calls=[("search_memory", {"query": "Kyoto trip"})]),
                           Behaviour(reply="You planned Kyoto for April."))
        final = await say(c, new, "Where was I travelling?")
        searched = final["params"]["searched"]
        assert searched[0]["query"] == "Kyoto trip" and searched[0]["chunkIds"]
        quoted = tool_messages(fake_openai.chat_requests[-1])[0]["content"]
        assert quoted.startswith("<recalled_memories>") and "Kyoto" in quoted
        assert quoted.rstrip().endswith("</recalled_memories>")


async def test_facts_off_offers_no_tools_and_no_section(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """memory.facts = "off": the request has no tools and the prompt no facts section."""
    async with running(chat_config(config_factory, fake_openai, facts="off")) as app, \
            Client.connect(app.url, TOKEN) as c:
        await c.call("memory.facts.add", {"text": "I like jazz"})
        key = (await c.call("sessions.create"))["sessionKey"]
        await say(c, key, "Play something I like")
        sent = fake_openai.chat_requests[-1].json
        assert "tools" not in sent
        assert all("remembered_facts" not in m["content"] for m in sent["messages"])
