"""Model-written titles: after a session's first reply the model names a session still called
"New session", off the reply's path, every watching tab hears it, and a rename, a failing or
slow model, or the setting turned off each do what they promise."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from gateway.chat.titles import clean_title, heuristic_title
from gateway.client import Client
from gateway.config import Config
from tests.conftest import TOKEN, running
from tests.fake_openai import Behaviour, FakeOpenAI
from tests.gateway.test_chat import run_to_end


def _config(factory: Callable[..., Config], fake: FakeOpenAI, **chat: Any) -> Config:
    return factory(llm={"base_url": fake.base_url, "api_key": "sk-test", "model": "fake-model",
                        "timeout_s": 5.0, "max_retries": 0},
                   chat={"auto_title": True, **chat})


async def _titled(c: Client, key: str, timeout: float = 10.0) -> str:
    """The session's title once a sessions.updated event for it arrives."""
    async with asyncio.timeout(timeout):
        while True:
            event = await c.next_event("sessions.updated")
            if event["params"]["sessionKey"] == key:
                return str(event["params"]["session"]["title"])


async def test_first_reply_gets_a_model_title_every_tab_hears(
        config_factory: Callable[..., Config], fake_openai: FakeOpenAI) -> None:
    """A session created without a title (as wscat or the CLI do) is named by the model after its
    first reply; chat.final does not wait for it; both watching tabs get sessions.updated."""
    fake_openai.title_behaviour = Behaviour(reply="\"Weekend in Porto.\"", first_byte_delay_s=0.5)
    async with running(_config(config_factory, fake_openai)) as app, \
            Client.connect(app.url, TOKEN) as a, Client.connect(app.url, TOKEN) as b:
        await a.call("sessions.watch")
        await b.call("sessions.watch")
        key = (await a.call("sessions.create"))["sessionKey"]
        run_id = (await a.call("chat.send",
                               {"sessionKey": key, "message": "Plan a weekend in Porto"}))["runId"]
        _, final = await run_to_end(a, run_id)
        assert final["method"] == "chat.final"
        # The final event came before the (delayed) title was written.
        assert (await a.call("sessions.get", {"sessionKey": key}))["title"] == "New session"
        assert await _titled(a, key) == "Weekend in Porto"
        assert await _titled(b, key) == "Weekend in Porto"
        assert (await a.call("sessions.get", {"sessionKey": key}))["title"] == "Weekend in Porto"
        request = fake_openai.title_requests[-1].json
        assert "Plan a weekend in Porto" in request["messages"][1]["content"]
        # Named once: a second exchange asks for no other title.
        await run_to_end(a, (await a.call("chat.send",
                                          {"sessionKey": key, "message": "more"}))["runId"])
        await asyncio.sleep(0.3)
        assert len(fake_openai.title_requests) == 1


@pytest.mark.parametrize("behaviour",
                         [Behaviour(status=500), Behaviour(hang=True), Behaviour(reply="  ")])
async def test_a_failing_slow_or_empty_model_falls_back_to_the_first_message(
        config_factory: Callable[..., Config], fake_openai: FakeOpenAI,
        behaviour: Behaviour) -> None:
    """When the title request fails, outlasts chat.title_timeout_s or answers nothing, the title
    is cut from the first message."""
    fake_openai.title_behaviour = behaviour
    async with running(_config(config_factory, fake_openai, title_timeout_s=0.5)) as app, \
            Client.connect(app.url, TOKEN) as c:
        await c.call("sessions.watch")
        key = (await c.call("sessions.create"))["sessionKey"]
        message = ("What should I cook tonight with leeks, potatoes and a little cream from "
                   "yesterday?")
        await run_to_end(c, (await c.call("chat.send",
                                          {"sessionKey": key, "message": message}))["runId"])
        title = await _titled(c, key)
        assert (title.startswith("What should I cook tonight") and title.endswith("…")
                and len(title) <= 60)


async def test_titles_leave_named_sessions_alone_and_can_be_turned_off(
        config_factory: Callable[..., Config], fake_openai: FakeOpenAI) -> None:
    """A session created with a title, or renamed before the title arrives, keeps its name; with
    chat.auto_title = false no title is ever asked for."""
    fake_openai.title_behaviour = Behaviour(reply="Model title", first_byte_delay_s=0.5)
    async with running(_config(config_factory, fake_openai)) as app, \
            Client.connect(app.url, TOKEN) as c:
        named = (await c.call("sessions.create", {"title": "Mine"}))["sessionKey"]
        await run_to_end(c, (await c.call("chat.send",
                                          {"sessionKey": named, "message": "hi"}))["runId"])
        renamed = (await c.call("sessions.create"))["sessionKey"]
        await run_to_end(c, (await c.call("chat.send",
                                          {"sessionKey": renamed, "message": "hi"}))["runId"])
        await c.call("sessions.update", {"sessionKey": renamed, "title": "My own name"})
        await asyncio.sleep(1.0)
        assert (await c.call("sessions.get", {"sessionKey": named}))["title"] == "Mine"
        assert (await c.call("sessions.get", {"sessionKey": renamed}))["title"] == "My own name"
    fake_openai.title_requests.clear()
    async with running(_config(config_factory, fake_openai, auto_title=False)) as app, \
            Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        await run_to_end(c, (await c.call("chat.send",
                                          {"sessionKey": key, "message": "hi"}))["runId"])
        await asyncio.sleep(0.3)
        assert (await c.call("sessions.get", {"sessionKey": key}))["title"] == "New session"
        assert fake_openai.title_requests == []


@pytest.mark.parametrize(("answer", "title"), [
    ('Title: "**Rust** as a favourite."', "Rust as a favourite"),
    ("# Trip to `Porto`\nmore text", "Trip to Porto"),
    ("[Lisbon](https://example.org) ideas", "Lisbon ideas"),
    ("snake_case in Python", "snake_case in Python"),
])
def test_a_model_title_is_plain_text(answer: str, title: str) -> None:
    """Markdown marks, quotes, a "Title:" label and a final period never reach a title: the
    sidebar shows titles as plain text."""
    assert clean_title(answer) == title


def test_the_fallback_title_is_plain_text_cut_at_a_word() -> None:
    """The first message's first line, without markdown marks, cut at a word with an ellipsis."""
    text = ("My **favourite** language is `Rust`, because the compiler catches my mistakes early\n"
            "second")
    assert heuristic_title(text) == "My favourite language is Rust, because the compiler…"
