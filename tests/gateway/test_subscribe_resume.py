"""sessions.subscribe mid-reply: its ``runs`` snapshot plus the deltas that follow it are the
reply exactly (real gateway, WebSocket clients and openai SDK against the slow fake model)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from gateway.app import App
from gateway.client import Client
from gateway.config import Config
from memory import BLOCK_CLOSE, BLOCK_OPEN
from tests.conftest import TOKEN, running
from tests.fake_openai import Behaviour, FakeOpenAI
from tests.gateway.test_chat import run_to_end
from tests.gateway.test_memory_methods import chat_config


async def resume(app: App, key: str, run_id: str) -> tuple[dict[str, Any], str, str] | None:
    """Subscribe from a fresh connection; returns the run's snapshot, the snapshot text joined
    with every delta the connection then receives, and the final reply's content (None if the
    run was over before the subscription)."""
    async with Client.connect(app.url, TOKEN) as late:
        result = await late.call("sessions.subscribe", {"sessionKey": key})
        snap = next((r for r in result["runs"] if r["runId"] == run_id), None)
        if snap is None:
            return None
        events, final = await run_to_end(late, run_id)
    assert final["method"] == "chat.final"
    deltas = [e["params"] for e in events if e["method"] == "chat.delta"]
    # The connection was attached in the same step as the snapshot was read: every later
    # event continues it, the first one with the very next seq.
    assert [e["params"]["seq"] for e in events][:1] == [snap["seq"] + 1]
    assert all(d["seq"] > snap["seq"] for d in deltas)
    return (snap, snap["text"] + "".join(d["delta"] for d in deltas),
            final["params"]["message"]["content"])


async def test_subscribe_mid_reply_returns_the_text_so_far(chat_app: App,
                                                           fake_openai: FakeOpenAI) -> None:
    """A second connection subscribing while a reply streams gets the run's text so far and its
    seq, and that text followed by the deltas it then receives is the final reply exactly."""
    reply = " ".join(f"w{i}" for i in range(60))
    fake_openai.configure(reply=reply, delta_delay_s=0.05)
    async with Client.connect(chat_app.url, TOKEN) as a:
        key = (await a.call("sessions.create"))["sessionKey"]
        run_id = (await a.call("chat.send", {"sessionKey": key, "message": "talk"}))["runId"]
        for _ in range(5):
            await a.next_event("chat.delta")
        resumed = await resume(chat_app, key, run_id)
        await run_to_end(a, run_id)
    assert resumed is not None
    snap, text, final = resumed
    assert (snap["seq"] >= 4 and snap["text"].startswith("w0 w1 w2")
            and len(snap["text"]) < len(reply))
    assert text == final == reply


async def test_subscribe_with_no_live_run_returns_no_runs(chat_app: App) -> None:
    """Subscribing to an idle session (before any run, and after one ended) lists no runs."""
    async with Client.connect(chat_app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        assert (await c.call("sessions.subscribe", {"sessionKey": key})
                == {"subscribed": True, "runs": []})
        run_id = (await c.call("chat.send", {"sessionKey": key, "message": "hi"}))["runId"]
        await run_to_end(c, run_id)
        assert (await c.call("sessions.subscribe", {"sessionKey": key}))["runs"] == []


async def test_snapshots_never_show_a_memory_update_block(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """With memory.facts = "block", snapshots taken all through a reply (the held-back block
    included) hold only published text, and each resumes into the stripped final reply."""
    text = " ".join(f"w{i}" for i in range(20))
    body = '{"remember": [{"text": "My cat is called Luna"}]}'
    fake_openai.script(Behaviour(reply=f"{text}\n\n{BLOCK_OPEN}\n{body}\n{BLOCK_CLOSE}\n",
                                 deltas=60, delta_delay_s=0.03))
    async with running(chat_config(config_factory, fake_openai, facts="block")) as app, \
            Client.connect(app.url, TOKEN) as a:
        key = (await a.call("sessions.create"))["sessionKey"]
        run_id = (await a.call("chat.send",
                               {"sessionKey": key, "message": "My cat is called Luna."}))["runId"]
        await a.next_event("chat.delta")
        ended = asyncio.create_task(run_to_end(a, run_id))
        resumes = []
        while not ended.done():
            # A fresh subscriber every 30 ms until the run is over.
            resumes.append(asyncio.create_task(resume(app, key, run_id)))
            await asyncio.sleep(0.03)
        _, final = await ended
        results = [r for r in await asyncio.gather(*resumes) if r is not None]
    assert final["params"]["message"]["content"] == text
    assert len(results) >= 3
    for snap, resumed, content in results:
        assert "<" not in snap["text"] and resumed == content == text
