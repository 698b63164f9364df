"""Compaction: the messages that left the history window are summarised by the session's model
in the background, kept as the session's summary and put into the next prompt between memory and
history; through the real gateway, WebSocket client and openai SDK against the fake model."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.app import App
from gateway.chat.compaction import plan_compaction
from gateway.chat.prompt import SUMMARY_CLOSE, SUMMARY_OPEN
from gateway.client import Client
from gateway.config import ChatConfig, Config
from memory import approx_tokens
from sessions import SessionsConfig, SessionStore
from testkit.fake_openai import Behaviour, RecordedRequest
from tests.conftest import TOKEN, running
from tests.fake_openai import FakeOpenAI
from tests.gateway.test_chat import run_to_end

# A window of 4 messages (two turns) and a summary every 2 messages that left it.
CHAT = {"history_limit": 4, "compaction_every": 2}


def _config(factory: Callable[..., Config], fake: FakeOpenAI, **chat: Any) -> Config:
    return factory(llm={"base_url": fake.base_url, "api_key": "sk-test", "model": "fake-model",
                        "timeout_s": 5.0, "max_retries": 0}, chat={**CHAT, **chat})


async def _turn(app: App, c: Client, key: str, text: str) -> None:
    """One chat.send to its final event, then the compaction it may have started, done."""
    sent = await c.call("chat.send", {"sessionKey": key, "message": text})
    assert (await run_to_end(c, sent["runId"]))[1]["method"] == "chat.final"
    await app.runs.compactor.idle()


def _prompt(fake: FakeOpenAI, question: str) -> list[dict[str, Any]]:
    """The messages of the reply request that asked ``question`` (the episode writer's own
    requests go to the same server)."""
    found = [r.json["messages"] for r in fake.chat_requests
             if r.json["messages"][-1]["content"] == question]
    assert found, question
    return list(found[-1])


def _new_part(request: RecordedRequest) -> str:
    return str(request.json["messages"][1]["content"]).partition("\n\nNew messages:\n")[2]


async def test_summary_is_kept_and_put_between_memory_and_history(
    backend_config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """Once two messages left the window a summary is written (both backends), sessions.get and
    the newest sessions.history page expose it, and the next prompt holds it at the end of the
    system message, after the memory sections, before the recent history."""
    async with running(_config(backend_config_factory, fake_openai)) as app, \
            Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        await _turn(app, c, key, "My storage locker combination is 4471-2963.")
        await _turn(app, c, key, "Tell me about tides.")
        assert fake_openai.compaction_requests == []  # four messages: all in the window
        assert (await c.call("sessions.get", {"sessionKey": key})).get("summary") is None
        await _turn(app, c, key, "And about the moon?")
        assert len(fake_openai.compaction_requests) == 1
        got = await c.call("sessions.get", {"sessionKey": key})
        summary = got["summary"]
        assert "4471-2963" in summary["text"] and summary["messages"] == 2
        history = await c.call("sessions.history", {"sessionKey": key, "limit": 50})
        assert history["summary"] == summary
        assert summary["through"] == history["messages"][1]["id"]  # the first reply
        await _turn(app, c, key, "What is my locker combination?")
    messages = _prompt(fake_openai, "What is my locker combination?")
    system = messages[0]["content"]
    assert system.rstrip().endswith(SUMMARY_CLOSE) and "4471-2963" in system.split(SUMMARY_OPEN)[1]
    assert system.index("Memory tools:") < system.index(SUMMARY_OPEN)
    assert [m["content"] for m in messages[1:]][-1] == "What is my locker combination?"
    assert not any("4471" in m["content"] for m in messages[1:])  # it left the window


async def test_summaries_are_incremental_and_at_most_one_per_every_messages(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """Each summary call gets the previous summary and only the messages since (never all of
    them again), and there is one call per chat.compaction_every messages that left the window."""
    async with running(_config(config_factory, fake_openai, compaction_every=4)) as app, \
            Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        for i in range(7):
            await _turn(app, c, key, f"message number {i}")
        # 14 messages, 4 in the window: 10 left it, so two calls of 4 (2 wait for the next).
        first, second = fake_openai.compaction_requests
        assert "Summary so far:\n(none yet)" in first.json["messages"][1]["content"]
        assert "message number 0" in _new_part(first) and "message number 1" in _new_part(first)
        assert _new_part(first).count("user: ") == 2 and _new_part(first).count("assistant: ") == 2
        previous = (await c.call("sessions.get", {"sessionKey": key}))["summary"]
        assert previous["messages"] == 8
        body = second.json["messages"][1]["content"]
        assert "message number 0" in body.partition("\n\nNew messages:\n")[0]  # the summary so far
        assert ("message number 0" not in _new_part(second)
                and "message number 2" in _new_part(second))
        assert _new_part(second).count("user: ") == 2


async def test_a_failing_or_hanging_summary_never_fails_a_reply(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """A summary call that fails leaves no summary and the replies go on; the next trigger tries
    again and succeeds; a call that never answers does not hold up the next reply either."""
    fake_openai.compaction_behaviour = Behaviour(status=500)
    cfg = _config(config_factory, fake_openai, compaction_timeout_s=1.0)
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        for i in range(3):
            await _turn(app, c, key, f"turn {i}")
        assert len(fake_openai.compaction_requests) == 1 and app.runs.compactor.failures == 1
        assert (await c.call("sessions.get", {"sessionKey": key})).get("summary") is None
        fake_openai.compaction_behaviour = Behaviour(hang=True)
        sent = await c.call("chat.send", {"sessionKey": key, "message": "turn 3"})
        assert (await run_to_end(c, sent["runId"]))[1]["method"] == "chat.final"
        async with asyncio.timeout(10):
            while len(fake_openai.compaction_requests) < 2:  # the hanging call is in flight ...
                await asyncio.sleep(0.01)
        sent = await c.call("chat.send", {"sessionKey": key, "message": "turn 4"})
        # ... and the next reply still completes, without a summary in its prompt.
        assert (await run_to_end(c, sent["runId"]))[1]["method"] == "chat.final"
        assert SUMMARY_OPEN not in _prompt(fake_openai, "turn 4")[0]["content"]
        await app.runs.compactor.idle()  # the hang ends at chat.compaction_timeout_s: a failure
        assert app.runs.compactor.failures == 2
        fake_openai.compaction_behaviour = Behaviour(reply="They talked about turns.")
        await _turn(app, c, key, "turn 5")
        got = (await c.call("sessions.get", {"sessionKey": key}))["summary"]
        assert got["text"] == "They talked about turns." and got["messages"] >= 2


async def test_summary_is_bounded_in_tokens_and_off_when_disabled(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """A model that overruns chat.compaction_max_tokens is cut to it; with chat.compaction off
    no summary call is made and no summary block is sent."""
    fake_openai.compaction_behaviour = Behaviour(reply=" ".join(["word"] * 400))
    async with running(_config(config_factory, fake_openai, compaction_max_tokens=50)) as app, \
            Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create", {"memory": False}))["sessionKey"]  # incognito too
        for i in range(3):
            await _turn(app, c, key, f"turn {i}")
        text = (await c.call("sessions.get", {"sessionKey": key}))["summary"]["text"]
        assert 0 < approx_tokens(text) <= 50
    fake_openai.compaction_requests.clear()
    async with running(_config(config_factory, fake_openai, compaction=False)) as app, \
            Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        for i in range(4):
            await _turn(app, c, key, f"turn {i}")
        assert fake_openai.compaction_requests == []
        assert SUMMARY_OPEN not in _prompt(fake_openai, "turn 3")[0]["content"]


def test_a_message_larger_than_a_call_s_input_is_summarised_by_its_start(tmp_path: Path) -> None:
    """The first message left to summarise is larger than one call may send: the plan holds its
    start, cut to fit, instead of a call that could never succeed (nothing after it summarised)."""
    config = ChatConfig(history_limit=4, compaction_every=2, max_context_tokens=500)
    with SessionStore(tmp_path, SessionsConfig()) as store:
        key = store.create("alice").session_key
        store.append_message("alice", key, role="user", content="word " * 5000)
        for i in range(8):
            store.append_message("alice", key, role="user" if i % 2 == 0 else "assistant",
                                 content=f"short {i}")
        plan = plan_compaction(config, store, "alice", key)
    assert plan is not None and len(plan.batch) == 1
    assert (approx_tokens(plan.batch[0].content) < 500
            and plan.batch[0].content.startswith("word word"))
