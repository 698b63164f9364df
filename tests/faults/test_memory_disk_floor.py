"""Issue 22, item 13: writes to the memory database check the free-disk floor the transcripts
check (``sessions.min_free_bytes``). Set above the real free space, a fact add or update, the
indexer's sync and an episode job all answer the "disk almost full" storage error and write
nothing; deleting a fact, which gives space back, still works."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import apsw
import pytest

from gateway.client import Client, RpcError
from gateway.config import Config
from memory import MemoryStorageError
from sessions import SessionsConfig, SessionStore
from tests.conftest import TOKEN, running

# More free space than any disk has: every write that adds rows is below the floor.
HUGE = 1 << 60


def assert_disk_full(err: RpcError) -> None:
    assert err.code == -32603 and err.message.startswith("storage error: disk almost full"), err
    assert "sessions.min_free_bytes" in err.message and err.data == {"retryable": True}


async def test_facts_are_not_added_or_updated_below_the_floor(
    config_factory: Callable[..., Config]
) -> None:
    """A fact saved while there is room; below the floor memory.facts.add and .update answer
    disk almost full and the facts stay as they were; memory.facts.delete still works."""
    async with running(config_factory()) as app, Client.connect(app.url, TOKEN) as c:
        fact = (await c.call("memory.facts.add", {"text": "I work at Acme"}))["fact"]
    async with running(config_factory(sessions={"min_free_bytes": HUGE})) as app, \
            Client.connect(app.url, TOKEN) as c:
        for method, params in (("memory.facts.add", {"text": "I live in Lisbon"}),
                               ("memory.facts.update", {"id": fact["id"],
                                                        "text": "I work at Initech"})):
            with pytest.raises(RpcError) as info:
                await c.call(method, params)
            assert_disk_full(info.value)
        listed = (await c.call("memory.facts.list", {"includeInactive": True}))["facts"]
        assert [(f["id"], f["text"]) for f in listed] == [(fact["id"], "I work at Acme")]
        await c.call("memory.facts.delete", {"id": fact["id"]})
        assert (await c.call("memory.facts.list"))["facts"] == []


async def test_the_indexer_writes_no_chunk_below_the_floor(
    config_factory: Callable[..., Config]
) -> None:
    """A transcript written while the daemon was down is not indexed below the floor: the
    catch-up sync fails with disk almost full (memory.status lastError), search finds nothing
    and memory.db holds no chunk and no file row."""
    cfg = config_factory(sessions={"min_free_bytes": HUGE})
    with SessionStore(cfg.data_dir, SessionsConfig(min_free_bytes=0)) as store:
        key = store.create("default").session_key
        store.append_message("default", key, role="user",
                             content="The lighthouse keeper is called Odile.")
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        status: dict[str, Any] = {}
        async with asyncio.timeout(20):
            while not status.get("lastError"):
                status = await c.call("memory.status")
                await asyncio.sleep(0.05)
        assert "disk almost full" in status["lastError"], status
        assert (await c.call("memory.search",
                             {"query": "lighthouse keeper Odile"}))["results"] == []
        assert app.memory is not None
        with pytest.raises(MemoryStorageError, match="disk almost full"):
            await app.memory.service.episodes.enqueue("default", key)
        assert (await app.memory.service.episodes.queue_state())["pending"] == 0
    db = apsw.Connection(str(cfg.data_dir / "memory.db"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        assert db.execute("SELECT count(*) FROM chunks").fetchone() == (0,)
        assert db.execute("SELECT count(*) FROM files").fetchone() == (0,)
        assert db.execute("SELECT count(*) FROM episode_jobs").fetchone() == (0,)
    finally:
        db.close()
