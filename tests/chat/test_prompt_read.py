"""What a run's prompt is read from: a send into an idle session reads its session and history
in the same hop that appends the user message (gateway/chat/runs.py, ChatRuns.submit), through
the real gateway, WebSocket client and openai SDK against the fake model."""

from __future__ import annotations

from gateway.app import App
from gateway.client import Client
from tests.conftest import TOKEN
from tests.fake_openai import FakeOpenAI
from tests.gateway.test_chat import run_to_end


async def test_send_to_an_idle_session_sees_the_last_reply_and_the_current_system_prompt(
    chat_app: App, fake_openai: FakeOpenAI
) -> None:
    """A send after a finished run shows the model that run's turns and the system prompt as
    updated since."""
    async with Client.connect(chat_app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        first = await c.call("chat.send", {"sessionKey": key, "message": "m0"})
        assert (await run_to_end(c, first["runId"]))[1]["method"] == "chat.final"
        await c.call("sessions.update", {"sessionKey": key, "systemPrompt": "Answer in one word."})
        second = await c.call("chat.send", {"sessionKey": key, "message": "m1"})
        assert (await run_to_end(c, second["runId"]))[1]["method"] == "chat.final"
    messages = fake_openai.chat_requests[-1].json["messages"]
    assert messages[0]["role"] == "system" and messages[0]["content"].startswith(
        "Answer in one word.")
    assert [(m["role"], m["content"]) for m in messages[-3:]] == [
        ("user", "m0"), ("assistant", "Echo: m0"), ("user", "m1")]




async def test_a_queued_run_reads_its_session_when_it_starts(
    chat_app: App, fake_openai: FakeOpenAI
) -> None:
    """A send queued behind a streaming run gets the system prompt as updated while it waited."""
    fake_openai.configure(delta_delay_s=0.02)
    async with Client.connect(chat_app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        first = await c.call("chat.send", {"sessionKey": key, "message": "m0 and more words"})
        await c.next_event("chat.delta")  # the first run is streaming: the second one queues
        second = await c.call("chat.send", {"sessionKey": key, "message": "m1"})
        await c.call("sessions.update", {"sessionKey": key, "systemPrompt": "Answer in one word."})
        assert (await run_to_end(c, first["runId"]))[1]["method"] == "chat.final"
        assert (await run_to_end(c, second["runId"]))[1]["method"] == "chat.final"
    first_request, second_request = (r.json["messages"] for r in fake_openai.chat_requests)
    assert not first_request[0]["content"].startswith("Answer in one word.")
    assert second_request[0]["content"].startswith("Answer in one word.")
    assert second_request[-1] == {"role": "user", "content": "m1"}
