"""Service life cycle: debounce, watching, closing."""

from __future__ import annotations

import asyncio
from pathlib import Path

from memory.errors import MemoryUnavailable
from tests.memory.conftest import (
    FakeEmbedder,
    MemoryBackend,
    append_messages,
    name_of,
    opened,
    quiet_config,
    write_transcript,
)


async def test_many_nudges_coalesce_into_one_sync(tmp_path: Path) -> None:
    """Thirty nudges inside the debounce window produce exactly one sync, which sees
    every append."""
    path = write_transcript(tmp_path, "alice", "s1", ["start"])
    async with opened(tmp_path, quiet_config(debounce_ms=150), FakeEmbedder()) as svc:
        before = svc.sync_count
        for i in range(30):
            append_messages(path, [f"appended line number {i} mentions gecko{i}"],
                            start_minute=i + 1)
            assert svc.nudge(path) is None  # type: ignore[func-returns-value]  # pins that it returns at once
            await asyncio.sleep(0.002)
        await asyncio.sleep(0.05)
        assert svc.sync_count == before  # still inside the quiet window
        await svc.wait_idle()
        assert svc.sync_count == before + 1
        hits = (await svc.search("alice", "gecko29", mode="keyword")).results
        assert len(hits) == 1


async def test_watcher_indexes_new_transcripts(tmp_path: Path) -> None:
    """With watch on, a transcript written to the sessions dir is indexed without a nudge."""
    # The user's directory exists before the watcher starts: a file written into a directory
    # created a moment earlier can race inotify's adding of that directory (the gateway's
    # nudge after each reply and the start-up sync cover that case, not the watcher).
    (tmp_path / "sessions" / "alice").mkdir(parents=True)
    async with opened(tmp_path, quiet_config(watch=True, debounce_ms=50), FakeEmbedder()) as svc:
        await asyncio.sleep(0.5)  # let the watcher set up its inotify watches
        write_transcript(tmp_path, "alice", "s1", ["a wombat walked by"])
        async with asyncio.timeout(10):
            while not (await svc.search("alice", "wombat", mode="keyword")).results:
                await asyncio.sleep(0.05)


async def test_close_is_idempotent_and_final(memory_backend: MemoryBackend) -> None:
    """close() twice is fine; afterwards calls fail with MemoryUnavailable."""
    svc = await memory_backend.unstarted(quiet_config(watch=True), FakeEmbedder())
    await svc.start()
    await svc.close()
    await svc.close()
    try:
        await svc.search("alice", "x")
    except MemoryUnavailable:
        pass
    else:
        raise AssertionError("search after close should fail")


async def test_search_does_not_wait_for_a_running_sync(memory_backend: MemoryBackend) -> None:
    """A search answers while a sync is stuck waiting on a slow embedder."""
    memory_backend.write("alice", "s1", ["first: the heron fishes"])
    gate, waiting = asyncio.Event(), asyncio.Event()

    class SlowEmbedder(FakeEmbedder):
        async def embed(self, texts: list[str], kind: str = "passage") -> list[list[float]]:
            if any("second" in t for t in texts):
                waiting.set()
                await gate.wait()
            return await super().embed(texts)

    async with memory_backend.opened(quiet_config(), SlowEmbedder()) as svc:
        memory_backend.write("alice", "s2", ["second: the heron sleeps"])
        syncing = asyncio.create_task(svc.sync_now())
        await waiting.wait()  # the sync holds: its chunks are written, their vectors are not
        assert not syncing.done()
        # The sync never finishes while the gate is shut, so any answer proves the search did
        # not wait for it; the bound only keeps a hang from stalling the suite.
        async with asyncio.timeout(30):
            hits = (await svc.search("alice", "heron", mode="keyword")).results
        assert {name_of(h.session_key) for h in hits} == {"s1", "s2"}
        gate.set()
        await syncing
