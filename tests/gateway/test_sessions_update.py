"""sessions.update and sessions.watch over the real socket: what changes, who hears of it,
and that a new system prompt is what the model is sent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gateway.app import App
from gateway.client import Client, RpcError
from gateway.config import Config
from tests.conftest import TOKEN, running
from tests.fake_openai import FakeOpenAI
from tests.gateway.test_chat import run_to_end


async def no_event(c: Client, wait: float = 0.3) -> None:
    """Assert that no notification arrives within ``wait`` seconds."""
    with pytest.raises(TimeoutError):
        await c.next_event(timeout=wait)


async def test_update_changes_title_and_prompt(client: Client) -> None:
    """sessions.update answers the session with its new values; get and list agree;
    updatedAt stays."""
    created = await client.call("sessions.create", {"title": "Draft"})
    key = created["sessionKey"]
    result = await client.call("sessions.update", {"sessionKey": key, "title": "Trip to Lisbon",
                                                   "systemPrompt": "Be brief."})
    assert result["title"] == "Trip to Lisbon" and result["systemPrompt"] == "Be brief."
    assert result["updatedAt"] == created["createdAt"]
    assert await client.call("sessions.get", {"sessionKey": key}) == result
    listed = (await client.call("sessions.list"))["sessions"]
    assert [s["title"] for s in listed] == ["Trip to Lisbon"]


@pytest.mark.parametrize(("params", "code"), [
    ({}, -32602),
    ({"title": ""}, -32602),
    ({"title": "x" * 201}, -32602),
    ({"title": 7}, -32602),
    ({"colour": "red"}, -32602),
])
async def test_bad_updates_answer_32602(client: Client, params: dict[str, Any], code: int) -> None:
    """No field, a blank, too long or mistyped title, or an unknown field is refused with -32602."""
    key = (await client.call("sessions.create"))["sessionKey"]
    with pytest.raises(RpcError) as info:
        await client.call("sessions.update", {"sessionKey": key, **params})
    assert info.value.code == code
    assert (await client.call("sessions.get", {"sessionKey": key}))["title"] == "New session"


async def test_update_of_unknown_key_is_32002(client: Client) -> None:
    """A key that is not one of the caller's sessions answers -32002, as sessions.get does."""
    with pytest.raises(RpcError) as info:
        await client.call("sessions.update", {"sessionKey": "0" * 32, "title": "x"})
    assert info.value.code == -32002


async def test_watchers_hear_changes_and_subscribers_do_not(app: App) -> None:
    """A watching connection hears created/updated/deleted for every session of its user, once
    each; a connection only subscribed to the session (its creator included) hears none of them,
    so a subscription still brings nothing but chat events."""
    async with Client.connect(app.url, TOKEN) as a, Client.connect(app.url, TOKEN) as watcher, \
            Client.connect(app.url, TOKEN) as subscriber:
        assert await watcher.call("sessions.watch") == {"watching": True}
        key = (await a.call("sessions.create", {"title": "One"}))["sessionKey"]
        created = await watcher.next_event("sessions.created")
        assert (created["params"]["sessionKey"] == key
                and created["params"]["session"]["title"] == "One")
        await subscriber.call("sessions.subscribe", {"sessionKey": key})
        # watching and subscribed: still once
        await watcher.call("sessions.subscribe", {"sessionKey": key})
        await a.call("sessions.update", {"sessionKey": key, "title": "Two"})
        event = await watcher.next_event("sessions.updated")
        assert event["params"] == {"sessionKey": key,
                                   "session": await a.call("sessions.get", {"sessionKey": key})}
        await no_event(watcher)
        await a.call("sessions.delete", {"sessionKey": key})
        assert (await watcher.next_event("sessions.deleted"))["params"] == {"sessionKey": key}
        await no_event(a)
        await no_event(subscriber)


async def test_watch_is_per_user(config_factory: Callable[..., Config]) -> None:
    """One user's watch never hears another user's sessions."""
    users = [{"name": "alice", "token": "alice-token-0123456789"},
             {"name": "bob", "token": "bob-token-0123456789xx"}]
    async with running(config_factory(auth={"users": users, "token": None})) as app, \
            Client.connect(app.url, "alice-token-0123456789") as alice, \
            Client.connect(app.url, "bob-token-0123456789xx") as bob:
        await bob.call("sessions.watch")
        await alice.call("sessions.create")
        await no_event(bob)


async def test_new_system_prompt_reaches_the_model(chat_app: App, fake_openai: FakeOpenAI) -> None:
    """After sessions.update sets a system prompt, the next run sends it as the system message."""
    async with Client.connect(chat_app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        await c.call("sessions.update", {"sessionKey": key, "systemPrompt": "Reply like a pirate."})
        run_id = (await c.call("chat.send", {"sessionKey": key, "message": "hi"}))["runId"]
        await run_to_end(c, run_id)
        first = fake_openai.chat_requests[-1].json["messages"][0]
        assert first["role"] == "system" and first["content"].startswith("Reply like a pirate.")
        history = await c.call("sessions.history", {"sessionKey": key})
        assert [m["role"] for m in history["messages"]] == ["user", "assistant"]


async def test_update_survives_restart(config_factory: Callable[..., Config]) -> None:
    """A renamed session keeps its new title after the daemon restarts."""
    cfg = config_factory()
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        await c.call("sessions.update", {"sessionKey": key, "title": "Kept"})
    (cfg.data_dir / "sessions.db").unlink()  # and rebuilt from the transcript
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        assert (await c.call("sessions.get", {"sessionKey": key}))["title"] == "Kept"


async def test_discover_lists_update_and_watch(client: Client) -> None:
    """rpc.discover describes sessions.update with its title bound, and sessions.watch."""
    doc = await client.call("rpc.discover")
    methods = {m["name"]: m for m in doc["methods"]}
    assert "sessions.watch" in methods
    params = {p["name"]: p for p in methods["sessions.update"]["params"]}
    assert set(params) == {"sessionKey", "title", "systemPrompt", "model", "temperature",
                           "maxTokens", "clear"}
    assert {"type": "string", "maxLength": 200} in params["title"]["schema"]["oneOf"]
