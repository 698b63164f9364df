"""chat.regenerate and chat.edit over the real socket: the transcript grows by lines that
supersede, history and the next prompt show only the latest versions, and a busy or empty
session is refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gateway.app import App
from gateway.client import Client, RpcError
from gateway.config import Config
from tests.conftest import TOKEN, running
from tests.fake_openai import Behaviour, FakeOpenAI
from tests.gateway.test_chat import run_to_end, transcript


async def _say(c: Client, key: str, text: str) -> dict[str, Any]:
    run_id = (await c.call("chat.send", {"sessionKey": key, "message": text}))["runId"]
    return (await run_to_end(c, run_id))[1]


async def _history(c: Client, key: str) -> list[tuple[str, str]]:
    page = await c.call("sessions.history", {"sessionKey": key})
    return [(m["role"], m["content"]) for m in page["messages"]]


async def test_regenerate_supersedes_the_last_reply(chat_app: App, fake_openai: FakeOpenAI) -> None:
    """The new reply answers the same message with the same context, its line names the reply it
    replaces, and history (and the next prompt) shows only the new one."""
    async with Client.connect(chat_app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        await _say(c, key, "first question")
        old = await _say(c, key, "second question")
        fake_openai.script(Behaviour(reply="A better answer."))
        run_id = (await c.call("chat.regenerate", {"sessionKey": key}))["runId"]
        _, final = await run_to_end(c, run_id)
        assert final["method"] == "chat.final"
        assert final["params"]["message"]["replaces"] == old["params"]["message"]["id"]
        sent = [m for m in fake_openai.chat_requests[-1].json["messages"] if m["role"] != "system"]
        assert [(m["role"], m["content"]) for m in sent] == [
            ("user", "first question"), ("assistant", "Echo: first question"),
            ("user", "second question")]
        assert await _history(c, key) == [
            ("user", "first question"), ("assistant", "Echo: first question"),
            ("user", "second question"), ("assistant", "A better answer.")]
        lines = [line for line in transcript(chat_app, key) if line.get("type") == "message"]
        assert len(lines) == 5 and lines[-1]["replaces"] == lines[-2]["id"]
        await _say(c, key, "third")
        sent = fake_openai.chat_requests[-1].json["messages"]
        assert "Echo: second question" not in [m["content"] for m in sent]
        assert "A better answer." in [m["content"] for m in sent]


async def test_edit_supersedes_the_last_message_and_its_reply(chat_app: App,
                                                              fake_openai: FakeOpenAI) -> None:
    """An edit appends the new text as a user line that replaces the old one; the old message and
    its reply leave history and the prompt; the run answers the new text."""
    async with Client.connect(chat_app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        await _say(c, key, "keep me")
        await _say(c, key, "tpyo here")
        run_id = (await c.call("chat.edit", {"sessionKey": key, "text": "typo fixed"}))["runId"]
        _, final = await run_to_end(c, run_id)
        assert final["params"]["message"]["content"] == "Echo: typo fixed"
        sent = [m for m in fake_openai.chat_requests[-1].json["messages"] if m["role"] != "system"]
        assert [m["content"] for m in sent] == ["keep me", "Echo: keep me", "typo fixed"]
        assert await _history(c, key) == [("user", "keep me"), ("assistant", "Echo: keep me"),
                                          ("user", "typo fixed"), ("assistant", "Echo: typo fixed")]
        lines = [line for line in transcript(chat_app, key) if line.get("type") == "message"]
        edited = next(line for line in lines if line["content"] == "typo fixed")
        assert edited["replaces"] == next(line["id"] for line in lines
                                          if line["content"] == "tpyo here")
        assert edited["runId"] == run_id
        # A second edit replaces the first edit's range too.
        run_id = (await c.call("chat.edit",
                               {"sessionKey": key, "text": "typo fixed twice"}))["runId"]
        await run_to_end(c, run_id)
        assert [text for _, text in await _history(c, key)] == [
            "keep me", "Echo: keep me", "typo fixed twice", "Echo: typo fixed twice"]


async def test_resend_into_a_busy_or_empty_session_is_refused(chat_app: App,
                                                              fake_openai: FakeOpenAI) -> None:
    """While a reply streams, regenerate and edit answer -32003 and write nothing; a session with
    nothing to regenerate or edit answers -32003 too; another user's key is -32002."""
    async with Client.connect(chat_app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        for method, params in (("chat.regenerate", {}), ("chat.edit", {"text": "x"})):
            with pytest.raises(RpcError) as info:
                await c.call(method, {"sessionKey": key, **params})
            assert info.value.code == -32003 and "nothing to" in info.value.message
        fake_openai.script(Behaviour(reply="slow reply here", delta_delay_s=0.2))
        run_id = (await c.call("chat.send", {"sessionKey": key, "message": "hello"}))["runId"]
        for method, params in (("chat.regenerate", {}), ("chat.edit", {"text": "x"})):
            with pytest.raises(RpcError) as info:
                await c.call(method, {"sessionKey": key, **params})
            assert info.value.code == -32003 and "busy" in info.value.message
        await c.call("chat.abort", {"sessionKey": key, "runId": run_id})
        await run_to_end(c, run_id)
        assert len(transcript(chat_app, key)) == 3
        with pytest.raises(RpcError) as info:
            await c.call("chat.regenerate", {"sessionKey": "0" * 32})
        assert info.value.code == -32002
        with pytest.raises(RpcError) as info:
            await c.call("chat.edit", {"sessionKey": key, "text": "  "})
        assert info.value.code == -32602


async def test_a_second_tab_sees_the_regenerated_reply(chat_app: App) -> None:
    """Subscribers of the session get the regenerate's events, final included, like a send's."""
    async with Client.connect(chat_app.url, TOKEN) as a, Client.connect(chat_app.url, TOKEN) as b:
        key = (await a.call("sessions.create"))["sessionKey"]
        await _say(a, key, "hello")
        await b.call("sessions.subscribe", {"sessionKey": key})
        run_id = (await a.call("chat.regenerate", {"sessionKey": key}))["runId"]
        _, final = await run_to_end(b, run_id)
        assert final["method"] == "chat.final" and "replaces" in final["params"]["message"]


async def test_regenerate_after_many_regenerations(
        config_factory: Callable[..., Config], fake_openai: FakeOpenAI) -> None:
    """However many superseded replies lie between the message and the end (more than the model's
    history window), regenerate still finds the message and sends no superseded reply with it."""
    cfg = config_factory(llm={"base_url": fake_openai.base_url, "model": "fake-model",
                              "max_retries": 0},
                         chat={"history_limit": 2, "max_queued_runs": 1})
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        await _say(c, key, "the question")
        for i in range(4):
            fake_openai.script(Behaviour(reply=f"take {i}"))
            await run_to_end(c, (await c.call("chat.regenerate", {"sessionKey": key}))["runId"])
            sent = [m for m in fake_openai.chat_requests[-1].json["messages"]
                    if m["role"] != "system"]
            assert [(m["role"], m["content"]) for m in sent] == [("user", "the question")]
        assert await _history(c, key) == [("user", "the question"), ("assistant", "take 3")]
        assert len([line for line in transcript(app, key) if line.get("type") == "message"]) == 6
