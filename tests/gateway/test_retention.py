"""Retention: memory.retention_days drops old chunks and facts for good; sessions.retention_days
deletes old transcripts; memory.status shows the sweep."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gateway.cli.importer import import_conversations, session_key_for
from gateway.cli.importer_formats import parse
from gateway.client import Client, RpcError
from gateway.config import Config
from gateway.retention import RetentionSweeper
from gateway.storage import open_session_store
from memory import MemoryOff
from sessions import SessionStore
from tests.conftest import TOKEN, running
from tests.gateway.test_memory_methods import search_until

NOW = datetime.now(UTC)


def seed(cfg: Config) -> tuple[str, str]:
    """One session whose messages are ten days old, one of today."""
    store = SessionStore(cfg.data_dir)
    try:
        old = store.create("default", title="old", created_at=NOW - timedelta(days=10)).session_key
        store.append_message("default", old, role="user",
                             content="The walrus sanctuary visit was lovely.",
                             ts=NOW - timedelta(days=10))
        new = store.create("default", title="new").session_key
        store.append_message("default", new, role="user",
                             content="Today the pelican flew over the harbour.")
    finally:
        store.close()
    return old, new


async def test_memory_retention_drops_old_chunks_and_facts_for_good(
        config_factory: Callable[..., Config]) -> None:
    """Chunks older than memory.retention_days are never indexed (not after a full reindex or a
    restart), a sweep removes facts not said within the window, and the transcript stays."""
    cfg = config_factory(memory={"retention_days": 3, "debounce_ms": 20})
    old, _ = seed(cfg)
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        await search_until(c, {"query": "pelican"})
        assert (await c.call("memory.search", {"query": "walrus sanctuary"}))["results"] == []
        await c.call("memory.facts.add", {"text": "I volunteer at a bird sanctuary"})
        assert app.retention is not None
        kept = await app.retention.sweep(now=NOW + timedelta(days=1))
        assert kept["facts"] == 0 and len((await c.call("memory.facts.list"))["facts"]) == 1
        removed = await app.retention.sweep(now=NOW + timedelta(days=4))
        assert removed["facts"] == 1 and removed["chunks"] >= 1  # today's chunk is 4 days old then
        assert (await c.call("memory.facts.list"))["facts"] == []
        status = (await c.call("memory.status"))["retention"]
        assert status["days"] == 3 and status["lastRemoved"] == removed and status["nextSweep"]
        await c.call("memory.reindex", {"full": True})
        await search_until(c, {"query": "pelican"})
        assert (await c.call("memory.search", {"query": "walrus sanctuary"}))["results"] == []
        history = (await c.call("sessions.history", {"sessionKey": old}))["messages"]
        assert "walrus" in history[0]["content"]
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        await search_until(c, {"query": "pelican"})
        assert (await c.call("memory.search", {"query": "walrus sanctuary"}))["results"] == []


async def test_sessions_retention_deletes_old_transcripts(
        config_factory: Callable[..., Config]) -> None:
    """A sweep with sessions.retention_days deletes transcripts not updated within the window,
    with their index rows, and keeps the others."""
    cfg = config_factory(sessions={"retention_days": 5}, memory={"debounce_ms": 20})
    old, new = seed(cfg)
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        await search_until(c, {"query": "walrus sanctuary"})
        assert app.retention is not None
        removed = await app.retention.sweep()
        assert removed["sessions"] == 1
        keys = [s["sessionKey"] for s in (await c.call("sessions.list"))["sessions"]]
        assert keys == [new]
        assert (await c.call("memory.search", {"query": "walrus sanctuary"}))["results"] == []
        assert not (cfg.data_dir / "sessions" / "default" / f"{old}.jsonl").exists()


def chatgpt_conversation(conversation_id: str, when: datetime, text: str) -> dict[str, Any]:
    """One single-message conversation shaped like ChatGPT's conversations.json, dated ``when``."""
    t = when.timestamp()
    message = {"id": "m1", "author": {"role": "user"}, "create_time": t,
               "content": {"content_type": "text", "parts": [text]}, "metadata": {}}
    return {"title": conversation_id, "create_time": t, "id": conversation_id, "current_node": "m1",
            "mapping": {"m1": {"id": "m1", "parent": None, "children": [], "message": message}}}


async def test_sessions_retention_deletes_an_imported_old_session_on_each_backend(
    backend_config_factory: Callable[..., Config],
) -> None:
    """With sessions.retention_days = 30 the first sweep deletes a session imported with a
    400-day-old date (its history and its memory) and keeps a recent one, on SQLite and on
    PostgreSQL alike."""
    cfg = backend_config_factory(sessions={"retention_days": 30}, memory={"debounce_ms": 20})
    export = [chatgpt_conversation("old", NOW - timedelta(days=400),
                                   "The walrus sanctuary visit was lovely."),
              chatgpt_conversation("new", NOW - timedelta(days=2),
                                   "The pelican flew over the harbour.")]
    report = import_conversations(cfg.data_dir, cfg.sessions, "default", "chatgpt",
                                  parse(json.dumps(export).encode(), "chatgpt"),
                                  storage=cfg.storage)
    assert report.created == 2
    old, new = (session_key_for("default", "chatgpt", name) for name in ("old", "new"))
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        await search_until(c, {"query": "walrus sanctuary"})
        assert app.retention is not None and app.retention.sweeps == 0
        removed = await app.retention.sweep()
        assert removed["sessions"] == 1
        keys = [s["sessionKey"] for s in (await c.call("sessions.list"))["sessions"]]
        assert keys == [new]
        with pytest.raises(RpcError) as info:
            await c.call("sessions.history", {"sessionKey": old})
        assert info.value.code == -32002
        assert (await c.call("memory.search", {"query": "walrus sanctuary"}))["results"] == []
        assert (await c.call("memory.status"))["retention"]["lastRemoved"]["sessions"] == 1


class NoRuns:
    """No chat runs to stop."""

    async def abort_session(self, user: str, session_key: str) -> None:
        return None


async def test_sessions_sweep_pages_through_every_user(
    backend_config_factory: Callable[..., Config],
) -> None:
    """The sweep asks the store for idle sessions a page at a time and deletes every one, of
    every user, however many pages they fill; recent sessions stay."""
    cfg = backend_config_factory()
    store = open_session_store(cfg.storage, cfg.data_dir, cfg.sessions)
    try:
        for user in ("alice", "bob", "carol"):
            for days in (40, 50, 60):
                store.create(user, created_at=NOW - timedelta(days=days))
        kept = store.create("bob", created_at=NOW - timedelta(days=1)).session_key
        sweeper = RetentionSweeper(store, NoRuns(), MemoryOff(), sessions_days=30, memory_days=0,
                                   page=2)
        assert (await sweeper.sweep(now=NOW))["sessions"] == 9
        assert ([[s.session_key for s in store.list(u)[0]] for u in ("alice", "bob", "carol")]
                == [[], [kept], []])
    finally:
        store.close()


async def test_no_sweep_when_retention_is_off(config_factory: Callable[..., Config]) -> None:
    """With both retention settings at 0 (the default) no sweep is scheduled and status
    says days 0."""
    async with running(config_factory()) as app, Client.connect(app.url, TOKEN) as c:
        assert app.retention is None
        assert (await c.call("memory.status"))["retention"] == {"days": 0}
