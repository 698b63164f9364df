"""The sync scheduler's loop: what each sync is asked to cover."""

from __future__ import annotations

import asyncio
from pathlib import Path

from memory.sqlite.index.scheduler import SyncScheduler


async def test_a_path_named_while_everything_is_due_gets_its_own_look_after() -> None:
    """A nudge naming a path that arrives while a sync of everything is due is not swallowed
    by it (that scan lists regular files only): the named path is synced on its own next."""
    calls: list[list[Path] | None] = []

    async def run_sync(paths: list[Path] | None) -> bool:
        calls.append(paths)
        return True

    scheduler = SyncScheduler(run_sync, debounce_ms=1)
    link = Path("/data/sessions/bob/0123456789abcdef0123456789abcdef.jsonl")
    scheduler.run_soon()   # the start's catch-up: everything
    scheduler.nudge(link)  # the watcher reports a file before that sync ran
    scheduler.start(None)
    try:
        async with asyncio.timeout(30):
            await scheduler.wait_idle()
    finally:
        await scheduler.close()
    assert calls == [None, [link]]


async def test_a_failed_sync_is_retried_with_back_off_until_one_succeeds() -> None:
    """A sync that fails is retried whole with no new nudge, after retry_s then twice that;
    the success that follows resets the wait and schedules nothing more."""
    loop = asyncio.get_running_loop()
    calls: list[tuple[list[Path] | None, float]] = []
    outcomes = [False, False, True]
    done = asyncio.Event()

    async def run_sync(paths: list[Path] | None) -> bool:
        calls.append((paths, loop.time()))
        ok = outcomes.pop(0) if outcomes else True
        if not outcomes:
            done.set()
        return ok

    scheduler = SyncScheduler(run_sync, debounce_ms=1, retry_s=0.2)
    scheduler.nudge(Path("/data/sessions/alice/0123456789abcdef0123456789abcdef.jsonl"))
    scheduler.start(None)
    try:
        async with asyncio.timeout(30):
            await done.wait()
            await asyncio.sleep(0.5)  # a retry wrongly left scheduled would have run by now
    finally:
        await scheduler.close()
    assert [paths for paths, _ in calls][1:] == [None, None]  # the retries cover every transcript
    gaps = [b - a for (_, a), (_, b) in zip(calls, calls[1:])]
    assert gaps[0] >= 0.2 and gaps[1] >= 0.4, gaps
    assert len(calls) == 3


async def test_no_retry_when_retry_s_is_zero() -> None:
    """retry_s = 0 leaves a failed sync to the next nudge."""
    calls: list[list[Path] | None] = []

    async def run_sync(paths: list[Path] | None) -> bool:
        calls.append(paths)
        return False

    scheduler = SyncScheduler(run_sync, debounce_ms=1, retry_s=0)
    scheduler.run_soon()
    scheduler.start(None)
    try:
        async with asyncio.timeout(30):
            await scheduler.wait_idle()
        await asyncio.sleep(0.3)
    finally:
        await scheduler.close()
    assert calls == [None]


async def test_a_whole_sync_that_succeeds_cancels_the_pending_retry() -> None:
    """After a failed sync, a successful sync of everything (a reindex, the next catch-up) makes
    the scheduled retry needless: it does not run."""
    calls: list[list[Path] | None] = []
    scheduler: SyncScheduler

    async def run_sync(paths: list[Path] | None) -> bool:
        calls.append(paths)
        if len(calls) == 1:
            scheduler.run_soon()  # asked for while the first sync runs; it runs right after it
            return False
        return True

    scheduler = SyncScheduler(run_sync, debounce_ms=1, retry_s=1.0)
    path = Path("/data/sessions/alice/0123456789abcdef0123456789abcdef.jsonl")
    scheduler.nudge(path)
    scheduler.start(None)
    try:
        async with asyncio.timeout(30):
            await scheduler.wait_idle()
        await asyncio.sleep(1.5)  # the retry, had it stayed scheduled, would have run by now
    finally:
        await scheduler.close()
    assert calls == [[path], None]
