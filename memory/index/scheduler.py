"""When to sync: the debounce loop and the ``watchfiles`` watcher.

``watchfiles`` on the sessions dir and :meth:`SyncScheduler.nudge` (the gateway nudges after
``chat.final``) mark paths dirty and wake the loop, which waits until nothing new arrived for
``debounce_ms`` (at most :data:`MAX_DEBOUNCE_FACTOR` × that under a steady stream) and then
runs one sync for everything marked. :meth:`~SyncScheduler.run_soon` (the start-up catch-up, a
reindex) skips the wait. One loop runs the syncs, so they never overlap.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from sessions import TRANSCRIPT_SUFFIX

__all__ = ["MAX_DEBOUNCE_FACTOR", "SyncScheduler"]

log = structlog.get_logger("memory.service")

MAX_DEBOUNCE_FACTOR = 10

# Runs one sync of these paths (None: every transcript). It must not raise: the loop has to
# survive a failed sync, so the caller records and logs the failure itself.
RunSync = Callable[[list[Path] | None], Awaitable[None]]


class SyncScheduler:
    def __init__(self, run_sync: RunSync, debounce_ms: int) -> None:
        self._run_sync = run_sync
        self._quiet = debounce_ms / 1000
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._immediate = False
        self._dirty_all = False
        self._dirty: set[Path] = set()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self, watch_dir: Path | None) -> None:
        """Start the loop, and a watcher on ``watch_dir`` unless it is None."""
        self._tasks.append(asyncio.create_task(self._loop(), name="memory-debounce"))
        if watch_dir is not None:
            self._tasks.append(asyncio.create_task(self._watch(watch_dir), name="memory-watch"))

    def nudge(self, path: Path | None = None) -> None:
        """Mark ``path`` (or everything) for the next debounced sync; returns at once."""
        if path is None:
            self._dirty_all = True
        else:
            self._dirty.add(Path(path))
        self._idle.clear()
        self._wake.set()

    def run_soon(self) -> None:
        """Sync everything as soon as the loop is free, without waiting for quiet."""
        self._dirty_all = True
        self._immediate = True
        self._idle.clear()
        self._wake.set()

    async def wait_idle(self) -> None:
        """Return once no sync is queued or running."""
        while True:
            await self._idle.wait()
            await asyncio.sleep(0)
            if self._idle.is_set() and not self._wake.is_set():
                return

    async def close(self) -> None:
        """Stop the watcher and the loop; re-raises only this task's own cancellation."""
        self._stop.set()
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
            except Exception:
                log.exception("memory.task.failed_on_close", task=task.get_name())

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        quiet = self._quiet
        while True:
            if not self._wake.is_set():
                self._idle.set()
            await self._wake.wait()
            self._idle.clear()
            self._wake.clear()
            if not self._immediate:
                deadline = loop.time() + quiet * MAX_DEBOUNCE_FACTOR
                while True:
                    wait = min(quiet, deadline - loop.time())
                    if wait <= 0:
                        break
                    try:
                        async with asyncio.timeout(wait):
                            await self._wake.wait()
                    except TimeoutError:
                        break
                    self._wake.clear()
            self._immediate = False
            named = self._dirty
            paths = None if self._dirty_all else sorted(named)
            self._dirty_all = False
            self._dirty = set()
            await self._run_sync(paths)
            if paths is None and named:
                # A sync of everything scans for regular files only, so a named path that is
                # not one (a symlink planted in a user's folder) was not looked at: it gets its
                # own look next, which records it as skipped. Regular ones cost a stat each.
                self._dirty |= named
                self._idle.clear()
                self._wake.set()

    async def _watch(self, root: Path) -> None:
        import watchfiles

        def only_transcripts(_change: watchfiles.Change, path: str) -> bool:
            return path.endswith(TRANSCRIPT_SUFFIX)

        try:
            async for changes in watchfiles.awatch(root, stop_event=self._stop,
                                                   watch_filter=only_transcripts, debounce=100,
                                                   recursive=True):
                for _change, path in changes:
                    self.nudge(Path(path))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("memory.watch.stopped", error=str(exc), effect="index follows nudges only")
