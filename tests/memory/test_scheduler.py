"""The sync scheduler's loop: what each sync is asked to cover."""

from __future__ import annotations

import asyncio
from pathlib import Path

from memory.index.scheduler import SyncScheduler


async def test_a_path_named_while_everything_is_due_gets_its_own_look_after() -> None:
    """A nudge naming a path that arrives while a sync of everything is due is not swallowed
    by it (that scan lists regular files only): the named path is synced on its own next."""
    calls: list[list[Path] | None] = []

    async def run_sync(paths: list[Path] | None) -> None:
        calls.append(paths)

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
