"""Versions and branches over the real socket on both storage backends: a regenerated reply and
an edited user message keep their earlier versions, sessions.history marks them, sessions.versions
lists them, chat.choose makes one current again by appending lines (what the model sees next and
what memory indexes), and chat.edit with messageId forks from an earlier message."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from gateway.client import Client, RpcError
from gateway.config import Config
from tests.conftest import TOKEN, running
from tests.fake_openai import Behaviour, FakeOpenAI
from tests.gateway.test_chat import run_to_end
from tests.gateway.test_conversation_memory import _resend, _texts, _until_found


def _config(factory: Callable[..., Config], fake_openai: FakeOpenAI) -> Config:
    return factory(llm={"base_url": fake_openai.base_url, "api_key": "sk-test",
                        "model": "fake-model", "timeout_s": 5.0, "max_retries": 0},
                   chat={"auto_title": False, "compaction": False}, memory={"debounce_ms": 20})


async def _say(c: Client, key: str, text: str) -> dict[str, Any]:
    run_id = (await c.call("chat.send", {"sessionKey": key, "message": text}))["runId"]
    return (await run_to_end(c, run_id))[1]


async def _choose(c: Client, key: str, message_id: str,
                  timeout: float = 10.0) -> list[dict[str, Any]]:
    """chat.choose once the session is idle (on PostgreSQL a run's lease outlives its
    chat.final)."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                return list((await c.call("chat.choose", {"sessionKey": key,
                                                          "messageId": message_id}))["messages"])
            except RpcError as exc:
                if exc.code != -32003 or "busy" not in exc.message:
                    raise
                await asyncio.sleep(0.02)


async def _shown(c: Client, key: str) -> list[dict[str, Any]]:
    return list((await c.call("sessions.history", {"sessionKey": key}))["messages"])


def _sent(fake: FakeOpenAI) -> list[str]:
    return [m["content"] for m in fake.chat_requests[-1].json["messages"] if m["role"] != "system"]


async def test_a_regenerated_reply_keeps_its_versions_and_an_older_one_can_be_chosen(
        backend_config_factory: Callable[..., Config], fake_openai: FakeOpenAI) -> None:
    """After a regenerate the reply is marked 2/2 with both ids, sessions.versions lists both texts,
    and choosing the first makes it the shown reply (1/2), the one the next prompt holds and the one
    memory.search finds, the regenerated one leaving the index."""
    async with running(_config(backend_config_factory, fake_openai)) as app, \
            Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        fake_openai.script(Behaviour(reply="Herons nest in alders."))
        first = (await _say(c, key, "where do herons nest?"))["params"]["message"]
        fake_openai.script(Behaviour(reply="Herons nest in tall reeds."))
        await run_to_end(c, await _resend(c, "chat.regenerate", {"sessionKey": key}))
        shown = await _shown(c, key)
        assert [m["content"] for m in shown] == ["where do herons nest?",
                                                 "Herons nest in tall reeds."]
        second = shown[-1]
        assert "versions" not in shown[0]
        assert second["versions"] == {"index": 2, "count": 2, "ids": [first["id"], second["id"]]}
        listed = await c.call("sessions.versions", {"sessionKey": key, "messageId": second["id"]})
        assert (listed["index"], listed["count"]) == (2, 2)
        assert [v["content"] for v in listed["versions"]] == ["Herons nest in alders.",
                                                              "Herons nest in tall reeds."]
        await _until_found(c, "herons reeds", "reeds")

        written = await _choose(c, key, first["id"])
        assert [(m["content"], m["replaces"], m["restores"]) for m in written] == [
            ("Herons nest in alders.", second["id"], first["id"])]
        shown = await _shown(c, key)
        assert [m["content"] for m in shown] == ["where do herons nest?", "Herons nest in alders."]
        assert shown[-1]["versions"] == {"index": 1, "count": 2, "ids": [first["id"], second["id"]]}
        assert await _choose(c, key, first["id"]) == []  # shown already: nothing appended

        await _say(c, key, "and in winter?")
        assert _sent(fake_openai) == ["where do herons nest?", "Herons nest in alders.",
                                      "and in winter?"]
        await _until_found(c, "herons alders", "alders")
        async with asyncio.timeout(10):
            while any("reeds" in t for t in await _texts(c, "herons reeds")):
                await asyncio.sleep(0.05)


async def test_editing_an_earlier_message_forks_and_the_old_branch_comes_back(
        backend_config_factory: Callable[..., Config], fake_openai: FakeOpenAI) -> None:
    """chat.edit with messageId of an earlier user message hides it and everything after it and
    answers the new text; the edited message is marked 2/2, and choosing the old version brings
    back its whole branch (the later turns too) as what the model sees next."""
    async with running(_config(backend_config_factory, fake_openai)) as app, \
            Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        await _say(c, key, "one")
        await _say(c, key, "two")
        old = (await _shown(c, key))[0]
        run_id = await _resend(c, "chat.edit",
                               {"sessionKey": key, "text": "uno", "messageId": old["id"]})
        await run_to_end(c, run_id)
        assert _sent(fake_openai) == ["uno"]
        shown = await _shown(c, key)
        assert [m["content"] for m in shown] == ["uno", "Echo: uno"]
        assert shown[0]["versions"] == {"index": 2, "count": 2, "ids": [old["id"], shown[0]["id"]]}
        assert "versions" not in shown[1]

        await _choose(c, key, old["id"])
        shown = await _shown(c, key)
        assert [m["content"] for m in shown] == ["one", "Echo: one", "two", "Echo: two"]
        assert shown[0]["versions"]["index"] == 1
        await _say(c, key, "three")
        assert _sent(fake_openai) == ["one", "Echo: one", "two", "Echo: two", "three"]
        # And back to the fork, which is still one version of that message.
        await _choose(c, key, shown[0]["versions"]["ids"][1])
        assert [m["content"] for m in await _shown(c, key)] == ["uno", "Echo: uno"]


async def test_a_continued_reply_is_the_same_version(
        config_factory: Callable[..., Config], fake_openai: FakeOpenAI) -> None:
    """A reply chat.continue wrote on counts as the cut reply's own version, not another one, so a
    regenerate after it makes 2 versions, the first being the whole continued text."""
    async with running(_config(config_factory, fake_openai)) as app, \
            Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        fake_openai.script(Behaviour(reply="Cut here", finish_reason="length"),
                           Behaviour(reply=" and done."))
        await _say(c, key, "tell me")
        await run_to_end(c, await _resend(c, "chat.continue", {"sessionKey": key}))
        assert "versions" not in (await _shown(c, key))[-1]
        await run_to_end(c, await _resend(c, "chat.regenerate", {"sessionKey": key}))
        last = (await _shown(c, key))[-1]
        listed = await c.call("sessions.versions", {"sessionKey": key, "messageId": last["id"]})
        assert [v["content"] for v in listed["versions"]] == ["Cut here and done.", "Echo: tell me"]
        assert last["versions"]["index"] == 2


async def test_choose_refuses_what_it_cannot_show(
        config_factory: Callable[..., Config], fake_openai: FakeOpenAI) -> None:
    """chat.choose with an id not in the session is -32602 on messageId, and an edit naming a
    message that is not a shown user message is -32003, neither writing a line."""
    async with running(_config(config_factory, fake_openai)) as app, \
            Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        reply = (await _say(c, key, "hi"))["params"]["message"]
        with pytest.raises(RpcError) as bad:
            await c.call("chat.choose", {"sessionKey": key, "messageId": "nope"})
        assert bad.value.code == -32602 and bad.value.data["field"] == "messageId"
        with pytest.raises(RpcError) as not_user:
            await c.call("chat.edit", {"sessionKey": key, "text": "x", "messageId": reply["id"]})
        assert not_user.value.code == -32003
        assert (await c.call("sessions.get", {"sessionKey": key}))["messageCount"] == 2
