"""Item 12 of issue 10: memory.status shows each user their own rows (the whole index only to
the admin), and memory.reindex {full: true} rebuilds only the caller's rows, rate-limited."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.client import Client, RpcError
from gateway.config import Config, ConfigError
from memory.sqlite.index.db import open_index
from tests.conftest import running
from tests.fake_openai import FakeOpenAI
from tests.gateway.test_memory_methods import say, search_until

ALICE = {"name": "alice", "token": "alice-token-0123456789abcdefghijkl"}
BOB = {"name": "bob", "token": "bob-token-0123456789abcdefghijklmno"}
WHOLE_INDEX = {"dbPath", "dbBytes", "cacheEntries", "skippedFiles"}


def two_users(factory: Callable[..., Config], fake: FakeOpenAI, **auth: Any) -> Config:
    return factory(auth={"users": [ALICE, BOB], "token": None, **auth},
                   llm={"base_url": fake.base_url, "api_key": "sk-test", "model": "fake-model",
                        "max_retries": 0},
                   memory={"debounce_ms": 20})


async def synced_after(c: Client, before: int, timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while True:
            status = await c.call("memory.status")
            if status["syncCount"] > before and not status["syncing"]:
                return
            await asyncio.sleep(0.05)


def indexed_at(data_dir: Path) -> dict[str, str]:
    """user -> when their (one) transcript was last indexed, read from memory.db itself."""
    db = open_index(data_dir / "memory.db", readonly=True).db
    try:
        return {user: at for user, at in db.execute("SELECT user, indexed_at FROM files")}
    finally:
        db.close()


async def test_status_is_scoped_to_the_caller(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """With two users and no admin, each sees only their own counts, and nobody the index's
    path, size, shared cache or skipped files."""
    async with running(two_users(config_factory, fake_openai)) as app:
        async with Client.connect(app.url, ALICE["token"]) as alice, \
                Client.connect(app.url, BOB["token"]) as bob:
            key = (await alice.call("sessions.create"))["sessionKey"]
            await say(alice, key, "Alice plants tulips in October.")
            await search_until(alice, {"query": "tulips October"})
            mine, theirs = await alice.call("memory.status"), await bob.call("memory.status")
    assert mine["files"] == 1 and mine["chunks"] >= 1 and mine["scope"] == "user"
    assert (theirs["files"], theirs["chunks"], theirs["embedded"], theirs["pending"]) == (
        0, 0, 0, 0)
    assert not WHOLE_INDEX & (set(mine) | set(theirs))
    assert str(app.config.data_dir) not in str(mine) + str(theirs)


async def test_the_admin_sees_the_whole_index(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """auth.admin = "alice": alice's memory.status counts bob's rows too and names the index
    file."""
    async with running(two_users(config_factory, fake_openai, admin="alice")) as app:
        async with Client.connect(app.url, ALICE["token"]) as alice, \
                Client.connect(app.url, BOB["token"]) as bob:
            key = (await bob.call("sessions.create"))["sessionKey"]
            await say(bob, key, "Bob keeps bees behind the barn.")
            await search_until(bob, {"query": "bees barn"})
            status = await alice.call("memory.status")
    assert status["scope"] == "all" and status["files"] == 1 and WHOLE_INDEX <= set(status)


def test_an_admin_who_is_not_a_user_is_refused(config_factory: Callable[..., Config]) -> None:
    """auth.admin naming no [[auth.users]] entry is a configuration mistake, said in one line."""
    with pytest.raises(ConfigError) as info:
        config_factory(auth={"users": [ALICE, BOB], "token": None, "admin": "mallory"})
    assert any("admin" in p and "mallory" in p for p in info.value.problems)


async def test_full_reindex_rebuilds_only_the_callers_rows_and_is_rate_limited(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """bob's full reindex re-chunks bob's transcripts (new chunk ids) and leaves alice's rows as
    they were; a second full reindex within limits.full_reindex_interval_s answers -32004."""
    async with running(two_users(config_factory, fake_openai)) as app:
        async with Client.connect(app.url, ALICE["token"]) as alice, \
                Client.connect(app.url, BOB["token"]) as bob:
            a_key = (await alice.call("sessions.create"))["sessionKey"]
            b_key = (await bob.call("sessions.create"))["sessionKey"]
            await say(alice, a_key, "Alice's kayak is bright orange.")
            await say(bob, b_key, "Bob's canoe is dark green.")
            await search_until(alice, {"query": "kayak orange"})
            await search_until(bob, {"query": "canoe green"})
            first = indexed_at(app.config.data_dir)
            before = (await bob.call("memory.status"))["syncCount"]
            assert await bob.call("memory.reindex", {"full": True}) == {"queued": True}
            await synced_after(bob, before)
            then = indexed_at(app.config.data_dir)
            assert then["bob"] > first["bob"], "bob's transcript was not re-read"
            assert then["alice"] == first["alice"], "bob's full reindex re-read alice's transcript"
            assert (await search_until(bob, {"query": "canoe green"}))["results"]
            with pytest.raises(RpcError) as info:
                await bob.call("memory.reindex", {"full": True})
            assert info.value.code == -32004 and info.value.data["retryAfterMs"] > 0
            # a plain sync is not limited
            assert await bob.call("memory.reindex") == {"queued": True}
            # per user
            assert await alice.call("memory.reindex", {"full": True}) == {"queued": True}
