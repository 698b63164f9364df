"""Per-chat model and parameters over the real socket: sessions.update switches an open session's
model within the operator's list and sets temperature / maxTokens within its bounds (kept on
both backends, sent upstream as temperature / max_tokens), and chat.continue carries on a reply
cut at the length limit in one longer line that supersedes it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gateway.client import Client, RpcError
from gateway.config import Config
from tests.conftest import TOKEN, running
from tests.fake_openai import Behaviour, FakeOpenAI
from tests.gateway.test_chat import run_to_end
from tests.gateway.test_conversation_memory import _resend


def _config(factory: Callable[..., Config], fake_openai: FakeOpenAI, **llm: Any) -> Config:
    return factory(llm={"base_url": fake_openai.base_url, "api_key": "sk-test",
                        "model": "fake-model", "models": ["other-model"], "timeout_s": 5.0,
                        "max_retries": 0, **llm},
                   chat={"auto_title": False, "compaction": False})


async def _say(c: Client, key: str, text: str) -> dict[str, Any]:
    run_id = (await c.call("chat.send", {"sessionKey": key, "message": text}))["runId"]
    return (await run_to_end(c, run_id))[1]


async def test_update_switches_the_model_of_an_open_session(
        backend_config_factory: Callable[..., Config], fake_openai: FakeOpenAI) -> None:
    """sessions.update {model} changes the session's model (get, the updated event, a restart
    agree) and the next run goes upstream on it; clearing it goes back to llm.model."""
    cfg = _config(backend_config_factory, fake_openai)
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        await _say(c, key, "hello")
        assert fake_openai.chat_requests[-1].json["model"] == "fake-model"
        await c.call("sessions.watch")
        wire = await c.call("sessions.update", {"sessionKey": key, "model": "other-model"})
        assert wire["model"] == "other-model"
        updated = await c.next_event("sessions.updated")
        assert updated["params"]["session"]["model"] == "other-model"
        final = await _say(c, key, "again")
        assert fake_openai.chat_requests[-1].json["model"] == "other-model"
        assert final["params"]["message"]["model"] == "other-model"
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        assert (await c.call("sessions.get", {"sessionKey": key}))["model"] == "other-model"
        wire = await c.call("sessions.update", {"sessionKey": key, "clear": ["model"]})
        assert "model" not in wire
        await _say(c, key, "third")
        assert fake_openai.chat_requests[-1].json["model"] == "fake-model"


async def test_update_refuses_a_model_not_offered(
        config_factory: Callable[..., Config], fake_openai: FakeOpenAI) -> None:
    """A model outside llm.model + llm.models is refused by sessions.update with the error
    sessions.create gives, and the session keeps its model."""
    async with running(_config(config_factory, fake_openai)) as app, \
            Client.connect(app.url, TOKEN) as c:
        with pytest.raises(RpcError) as created:
            await c.call("sessions.create", {"model": "gpt-9"})
        key = (await c.call("sessions.create"))["sessionKey"]
        with pytest.raises(RpcError) as updated:
            await c.call("sessions.update", {"sessionKey": key, "model": "gpt-9"})
        assert updated.value.code == created.value.code == -32602
        assert updated.value.message == created.value.message
        assert updated.value.data["field"] == "model"
        assert "model" not in await c.call("sessions.get", {"sessionKey": key})


async def test_temperature_and_max_tokens_are_kept_and_sent(
        backend_config_factory: Callable[..., Config], fake_openai: FakeOpenAI) -> None:
    """A session's temperature and maxTokens survive a restart on either backend and go upstream
    as temperature / max_tokens; unset, neither is sent; past the operator's bounds is -32602."""
    cfg = _config(backend_config_factory, fake_openai, max_temperature=1.0, max_tokens_limit=500)
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        await _say(c, key, "plain")
        body = fake_openai.chat_requests[-1].json
        assert "temperature" not in body and "max_tokens" not in body
        wire = await c.call("sessions.update",
                            {"sessionKey": key, "temperature": 0.3, "maxTokens": 50})
        assert (wire["temperature"], wire["maxTokens"]) == (0.3, 50)
        for params, field in (({"temperature": 1.5}, "temperature"),
                              ({"maxTokens": 501}, "maxTokens"),
                              ({"temperature": -0.1}, "temperature"),
                              ({"maxTokens": 0}, "maxTokens")):
            with pytest.raises(RpcError) as refused:
                await c.call("sessions.update", {"sessionKey": key, **params})
            assert refused.value.code == -32602 and refused.value.data["field"] == field
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        got = await c.call("sessions.get", {"sessionKey": key})
        assert (got["temperature"], got["maxTokens"]) == (0.3, 50)
        await _say(c, key, "tuned")
        body = fake_openai.chat_requests[-1].json
        assert (body["temperature"], body["max_tokens"]) == (0.3, 50)
        wire = await c.call("sessions.update", {"sessionKey": key, "clear": ["temperature"]})
        assert "temperature" not in wire and wire["maxTokens"] == 50
        await _say(c, key, "half tuned")
        body = fake_openai.chat_requests[-1].json
        assert "temperature" not in body and body["max_tokens"] == 50


async def test_a_lowered_bound_caps_what_a_session_chose_before(
        config_factory: Callable[..., Config], fake_openai: FakeOpenAI) -> None:
    """A session that chose more than the operator's bound allows after a restart goes out with
    the bound, not its own value."""
    async with running(_config(config_factory, fake_openai)) as app, \
            Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        await c.call("sessions.update", {"sessionKey": key, "temperature": 1.8, "maxTokens": 4000})
    lowered = _config(config_factory, fake_openai, max_temperature=0.5, max_tokens_limit=100)
    async with running(lowered) as app, Client.connect(app.url, TOKEN) as c:
        await _say(c, key, "capped")
        body = fake_openai.chat_requests[-1].json
        assert (body["temperature"], body["max_tokens"]) == (0.5, 100)


async def test_continue_carries_on_a_reply_cut_by_length(
        backend_config_factory: Callable[..., Config], fake_openai: FakeOpenAI) -> None:
    """chat.continue sends the cut reply back as the last assistant message, streams only the
    new text, and writes the whole reply as one line that supersedes the cut one."""
    async with running(_config(backend_config_factory, fake_openai)) as app, \
            Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        fake_openai.script(Behaviour(reply="The first half", finish_reason="length"),
                           Behaviour(reply=" and the rest."))
        cut = await _say(c, key, "tell me a story")
        assert cut["params"]["message"]["finishReason"] == "length"
        run_id = await _resend(c, "chat.continue", {"sessionKey": key})
        events, final = await run_to_end(c, run_id)
        assert final["method"] == "chat.final"
        sent = [m for m in fake_openai.chat_requests[-1].json["messages"] if m["role"] != "system"]
        assert sent[-2:] == [{"role": "user", "content": "tell me a story"},
                             {"role": "assistant", "content": "The first half"}]
        assert ("".join(e["params"]["delta"] for e in events if e["method"] == "chat.delta")
                == " and the rest.")
        message = final["params"]["message"]
        assert message["content"] == "The first half and the rest."
        assert message["replaces"] == message["continues"] == cut["params"]["message"]["id"]
        assert message["finishReason"] == "stop"
        page = await c.call("sessions.history", {"sessionKey": key})
        assert [(m["role"], m["content"]) for m in page["messages"]] == [
            ("user", "tell me a story"), ("assistant", "The first half and the rest.")]
        with pytest.raises(RpcError) as refused:
            await _resend(c, "chat.continue", {"sessionKey": key})
        assert refused.value.code == -32003 and "length limit" in refused.value.message
