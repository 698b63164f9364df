"""Retention: memory.retention_days drops old chunks and facts for good; sessions.retention_days
deletes old transcripts; memory.status shows the sweep."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from gateway.client import Client
from gateway.config import Config
from sessions import SessionStore
from tests.conftest import TOKEN, running
from tests.gateway.test_memory_methods import search_until

NOW = datetime.now(UTC)


def seed(cfg: Config) -> tuple[str, str]:
    """One session whose messages are ten days old, one of today."""
    store = SessionStore(cfg.data_dir)
    try:
        old = store.create("default", title="old", created_at=NOW - timedelta(days=10)).session_key
        store.append_message("default", old, role="user", content="The walrus sanctuary visit was lovely.",
                             ts=NOW - timedelta(days=10))
        new = store.create("default", title="new").session_key
        store.append_message("default", new, role="user", content="Today the pelican flew over the harbour.")
    finally:
        store.close()
    return old, new


async def test_memory_retention_drops_old_chunks_and_facts_for_good(config_factory: Callable[..., Config]) -> None:
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


async def test_sessions_retention_deletes_old_transcripts(config_factory: Callable[..., Config]) -> None:
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


async def test_no_sweep_when_retention_is_off(config_factory: Callable[..., Config]) -> None:
    """With both retention settings at 0 (the default) no sweep is scheduled and status says days 0."""
    async with running(config_factory()) as app, Client.connect(app.url, TOKEN) as c:
        assert app.retention is None
        assert (await c.call("memory.status"))["retention"] == {"days": 0}
