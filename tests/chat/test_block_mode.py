"""memory.facts = "block": a trailing <memory_update> block, held back, stripped and applied,
through the real gateway, WebSocket client and openai SDK against the fake model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.client import Client
from gateway.config import Config
from memory import BLOCK_CLOSE, BLOCK_OPEN
from tests.conftest import TOKEN, running
from tests.fake_openai import Behaviour, FakeOpenAI
from tests.gateway.test_chat import run_to_end
from tests.gateway.test_memory_methods import chat_config


def block(body: str) -> str:
    return f"\n\n{BLOCK_OPEN}\n{body}\n{BLOCK_CLOSE}\n"


async def send(c: Client, key: str, text: str) -> tuple[str, dict[str, Any]]:
    """The concatenated chat.delta texts of one run, and its terminal event."""
    run_id = (await c.call("chat.send", {"sessionKey": key, "message": text}))["runId"]
    events, final = await run_to_end(c, run_id)
    return "".join(e["params"]["delta"] for e in events if e["method"] == "chat.delta"), final


async def assistant_texts(c: Client, key: str) -> list[str]:
    history = (await c.call("sessions.history", {"sessionKey": key}))["messages"]
    return [m["content"] for m in history if m["role"] == "assistant"]


async def test_trailing_block_saves_a_fact_and_is_never_seen(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """A block at the end of the reply saves its fact (listed in chat.final), and neither the
    deltas, the final message nor sessions.history contain it; the request offers no tools."""
    reply = "Nice, a cat named Luna!"
    fake_openai.script(Behaviour(reply=reply + block(
        '{"remember": [{"text": "My cat is called Luna"}]}')))
    async with running(chat_config(config_factory, fake_openai, facts="block")) as app, \
            Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        streamed, final = await send(c, key, "My cat is called Luna.")
        assert final["method"] == "chat.final"
        assert streamed == reply and final["params"]["message"]["content"] == reply
        assert [(f["action"], f["fact"]["text"]) for f in final["params"]["facts"]] == [
            ("added", "My cat is called Luna")]
        assert await assistant_texts(c, key) == [reply]
        listed = (await c.call("memory.facts.list"))["facts"]
        assert [(f["text"], f["sessionKey"]) for f in listed] == [("My cat is called Luna", key)]
        request = fake_openai.chat_requests[-1].json
        assert "tools" not in request and BLOCK_OPEN in request["messages"][0]["content"]


async def test_block_in_single_character_deltas_with_correction_and_forget(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """A block streamed one character per delta is still stripped, and its replaces/forget go
    through the same store code as the tools (a new version, a deletion)."""
    async with running(chat_config(config_factory, fake_openai, facts="block")) as app, \
            Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        age = (await c.call("memory.facts.add", {"text": "Luna is 3 years old"}))["fact"]
        job = (await c.call("memory.facts.add", {"text": "I work at Acme"}))["fact"]
        reply = "Happy birthday to Luna!"
        text = reply + block(f'{{"remember": [{{"text": "Luna is 4 years old", '
                             f'"replaces": {age["id"]}}}], "forget": [{job["id"]}]}}')
        fake_openai.script(Behaviour(reply=text, deltas=len(text)))
        streamed, final = await send(c, key, "Luna turned 4, and forget my job.")
        assert streamed == reply and await assistant_texts(c, key) == [reply]
        changes = [(f["action"], f.get("previousId")) for f in final["params"]["facts"]]
        assert changes == [("replaced", age["id"]), ("deleted", None)]
        # The prompt listed the facts with their ids, so the model could name them.
        assert (f'[{age["id"]}] "Luna is 3 years old"'
                in fake_openai.chat_requests[-1].json["messages"][0]["content"])
        assert [f["text"] for f in (await c.call("memory.facts.list"))["facts"]] == [
            "Luna is 4 years old"]


async def test_partial_or_mid_text_tag_streams_unchanged(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """Text that mentions the tag mid-line, or starts a line with part of it, is not a block:
    it reaches the client and the transcript intact, and nothing is saved."""
    reply = (f"In XML you might write {BLOCK_OPEN} inline.\n<memory_upd is a typo, and\n"
             f"{BLOCK_OPEN}\n{{\"remember\": [\"x y z\"]}}\n{BLOCK_CLOSE}\nfollowed by more words.")
    fake_openai.script(Behaviour(reply=reply, deltas=len(reply) // 3))
    async with running(chat_config(config_factory, fake_openai, facts="block")) as app, \
            Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        streamed, final = await send(c, key, "Tell me about tags.")
        assert streamed == reply and final["params"]["message"]["content"] == reply
        assert "facts" not in final["params"] and await assistant_texts(c, key) == [reply]
        assert (await c.call("memory.facts.list"))["facts"] == []


async def test_malformed_block_saves_nothing_and_reply_is_intact(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """A trailing block that is not valid JSON, or never closed, is stripped, saves nothing, and
    the run still ends in chat.final with the reply before it."""
    fake_openai.script(Behaviour(reply="Got it." + block('{"remember": [{"text": "oops"')),
                       Behaviour(reply=f"Sure thing.\n{BLOCK_OPEN}\n"
                                       f"{{\"remember\": [\"I like tea\"]}}",
                                 finish_reason="length"))
    async with running(chat_config(config_factory, fake_openai, facts="block")) as app, \
            Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        first_streamed, first = await send(c, key, "I like tea.")
        second_streamed, second = await send(c, key, "Really, tea.")
        assert (first["method"], first_streamed, first["params"]["message"]["content"]) == (
            "chat.final", "Got it.", "Got it.")
        assert (second["method"], second_streamed) == ("chat.final", "Sure thing.")
        assert "facts" not in first["params"] and "facts" not in second["params"]
        assert await assistant_texts(c, key) == ["Got it.", "Sure thing."]
        assert (await c.call("memory.facts.list"))["facts"] == []


async def test_off_offers_no_tools_and_keeps_a_block_as_text(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """With facts "off" the request has no tools and no memory instructions, and a block-shaped
    ending is ordinary reply text that saves nothing."""
    reply = "Hello." + block('{"remember": ["I am a pilot"]}')
    fake_openai.script(Behaviour(reply=reply))
    async with running(chat_config(config_factory, fake_openai, facts="off")) as app, \
            Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        streamed, final = await send(c, key, "I am a pilot.")
        assert streamed == reply and "facts" not in final["params"]
        request = fake_openai.chat_requests[-1].json
        assert "tools" not in request and all(BLOCK_OPEN not in m["content"]
                                              for m in request["messages"])
        assert (await c.call("memory.facts.list"))["facts"] == []


async def test_tool_mode_falls_back_to_block_once_the_model_refuses_tools(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """In "tool" mode, after the model answered 400 to tools, later runs ask for the block
    instead, and a block then saves the fact."""
    fake_openai.configure(reject_tools=True)
    async with running(chat_config(config_factory, fake_openai)) as app, \
            Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        await send(c, key, "Hello")
        fake_openai.script(Behaviour(reply="Oslo is lovely." + block(
            '{"remember": [{"text": "I live in Oslo"}]}')))
        streamed, final = await send(c, key, "I live in Oslo.")
        assert (streamed == "Oslo is lovely."
                and final["params"]["facts"][0]["fact"]["text"] == "I live in Oslo")
        assert BLOCK_OPEN in fake_openai.chat_requests[-1].json["messages"][0]["content"]
