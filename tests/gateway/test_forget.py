"""memory.forget: matching messages leave the index (and with purgeTranscript the transcript),
with the facts saved from them, and a restart or a full reindex does not bring them back."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gateway.client import Client, RpcError
from gateway.config import Config
from gateway.storage import open_session_store
from tests.conftest import TOKEN, running
from tests.fake_openai import Behaviour, FakeOpenAI
from tests.gateway.test_memory_methods import chat_config, say, search_until

DAY1 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def seed(cfg: Config) -> tuple[str, str]:
    """Session A: a message on day 1 and one on day 3; session B: one on day 1."""
    # the backend the gateway will use
    store = open_session_store(cfg.storage, cfg.data_dir, cfg.sessions)
    try:
        a = store.create("default", title="a", created_at=DAY1).session_key
        store.append_message("default", a, role="user",
                             content="The quokka photo was taken on Rottnest.", ts=DAY1)
        store.append_message("default", a, role="user",
                             content="Later we talked about the narwhal tusk.",
                             ts=DAY1 + timedelta(days=2))
        b = store.create("default", title="b", created_at=DAY1).session_key
        store.append_message("default", b, role="user",
                             content="Session B mentions the axolotl tank.", ts=DAY1)
    finally:
        store.close()
    return a, b


async def hits(c: Client, query: str) -> list[dict[str, Any]]:
    return list((await c.call("memory.search", {"query": query, "mode": "keyword"}))["results"])


async def check_after_reindex_and_restart(cfg: Config, gone: str, kept: str) -> None:
    """After a full reindex and after a restart, ``gone`` stays unfound while ``kept`` is found."""
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        await c.call("memory.reindex", {"full": True})
        await search_until(c, {"query": kept})
        await asyncio.sleep(0.1)
        assert await hits(c, gone) == []


async def test_forget_without_purge_keeps_the_transcript_but_not_the_memory(
    backend_config_factory: Callable[..., Config],
) -> None:
    """A time window of one session is forgotten from the index for good; the transcript, the
    rest of the session and other sessions stay searchable."""
    cfg = backend_config_factory(memory={"debounce_ms": 20})
    a, b = seed(cfg)
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        await search_until(c, {"query": "axolotl"})
        await search_until(c, {"query": "quokka"})
        result = await c.call("memory.forget",
                              {"sessionKey": a, "before": (DAY1 + timedelta(days=1)).isoformat()})
        assert result["chunks"] >= 1 and result["messages"] == 0
        assert await hits(c, "quokka") == []
        assert await hits(c, "axolotl")
        history = (await c.call("sessions.history", {"sessionKey": a}))["messages"]
        assert "quokka" in history[0]["content"]
    await check_after_reindex_and_restart(cfg, "quokka", "axolotl")


async def test_forget_with_purge_removes_the_messages_from_the_transcript(
    backend_config_factory: Callable[..., Config],
) -> None:
    """purgeTranscript rewrites the transcript without the matching messages, on both backends
    (without a sessionKey too: every session of the caller's is purged); the others stay, the
    session's count follows, and the forgotten text never returns."""
    cfg = backend_config_factory(memory={"debounce_ms": 20})
    a, _ = seed(cfg)
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        await search_until(c, {"query": "quokka"})
        result = await c.call("memory.forget", {"after": DAY1.isoformat(),
                                                "before": (DAY1 + timedelta(hours=1)).isoformat(),
                                                "purgeTranscript": True})
        assert result["messages"] == 2  # the day-1 messages of A and of B
        history = (await c.call("sessions.history", {"sessionKey": a}))["messages"]
        assert [m["content"] for m in history] == ["Later we talked about the narwhal tusk."]
        assert (await c.call("sessions.get", {"sessionKey": a}))["messageCount"] == 1
        await search_until(c, {"query": "narwhal"})
        assert await hits(c, "quokka") == [] and await hits(c, "axolotl") == []
        if cfg.storage.backend == "sqlite":
            raw = (cfg.data_dir / "sessions" / "default" / f"{a}.jsonl").read_text()
            assert "quokka" not in raw and "narwhal" in raw
    await check_after_reindex_and_restart(cfg, "quokka", "narwhal")


async def test_forget_purge_without_a_session_key_skips_a_session_gone_since_it_was_listed(
    config_factory: Callable[..., Config],
) -> None:
    """A session that disappears between the listing and its purge (here its transcript removed
    behind the store's back) is skipped: the caller's other sessions are still purged and
    forgotten, instead of the call failing half-way with -32002."""
    cfg = config_factory(memory={"debounce_ms": 20})
    a, b = seed(cfg)
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        await search_until(c, {"query": "axolotl"})
        (cfg.data_dir / "sessions" / "default" / f"{b}.jsonl").unlink()
        result = await c.call("memory.forget", {"before": (DAY1 + timedelta(hours=1)).isoformat(),
                                                "purgeTranscript": True})
        assert result["messages"] == 1 and result["chunks"] >= 1
        history = (await c.call("sessions.history", {"sessionKey": a}))["messages"]
        assert [m["content"] for m in history] == ["Later we talked about the narwhal tusk."]
        assert await hits(c, "quokka") == []


async def test_forget_removes_facts_saved_in_that_session(
    backend_config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """Facts the model saved in the forgotten session go; facts from elsewhere and the user's
    own stay."""
    async with running(chat_config(backend_config_factory, fake_openai)) as app, \
            Client.connect(app.url, TOKEN) as c:
        a = (await c.call("sessions.create"))["sessionKey"]
        b = (await c.call("sessions.create"))["sessionKey"]
        for key, text in ((a, "I am allergic to cats"), (b, "I play chess on Sundays")):
            fake_openai.script(Behaviour(reply="", tool_calls=[("remember", {"text": text})]),
                               Behaviour(reply="ok"))
            await say(c, key, text)
        await c.call("memory.facts.add", {"text": "My name is Robin"})
        result = await c.call("memory.forget", {"sessionKey": a})
        assert result["facts"] == 1
        texts = sorted(f["text"] for f in
                       (await c.call("memory.facts.list", {"includeInactive": True}))["facts"])
        assert texts == ["I play chess on Sundays", "My name is Robin"]


async def test_forget_refuses_unscoped_or_bad_input(config_factory: Callable[..., Config]) -> None:
    """No scope at all, a bad date, an empty window or another user's session are refused and
    nothing is removed."""
    cfg = config_factory(memory={"debounce_ms": 20})
    seed(cfg)
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        await search_until(c, {"query": "quokka"})
        bad: list[tuple[dict[str, Any], int]] = [
            ({}, -32602), ({"after": "yesterday-ish"}, -32602),
            ({"after": "2026-03-02", "before": "2026-03-01"}, -32602),
            ({"sessionKey": "f" * 32}, -32002)]
        for params, code in bad:
            with pytest.raises(RpcError) as info:
                await c.call("memory.forget", params)
            assert info.value.code == code
        assert await hits(c, "quokka")
