"""When to sync: the debounce loop and the ``watchfiles`` watcher.

``watchfiles`` on the sessions dir and :meth:`SyncScheduler.nudge` (the gateway nudges after
``chat.final``) mark paths dirty and wake the loop, which waits until nothing new arrived for
``debounce_ms`` (at most :data:`MAX_DEBOUNCE_FACTOR` × that under a steady stream) and then
runs one sync for everything marked. :meth:`~SyncScheduler.run_soon` (the start-up catch-up, a
reindex) skips the wait. One loop runs the syncs, so they never overlap. A sync that fails is
retried whole after a back-off (``retry_s``, doubled each time up to :data:`RETRY_MAX_S`): an
idle daemon gets no other nudge, and its transcripts would stay unindexed until the next change.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from memory.config import RETRY_MAX_S
from sessions import TRANSCRIPT_SUFFIX

__all__ = ["MAX_DEBOUNCE_FACTOR", "RETRY_MAX_S", "SyncScheduler"]

log = structlog.get_logger("memory.service")

MAX_DEBOUNCE_FACTOR = 10

# Runs one sync of these paths (None: every transcript) and says whether it succeeded. It must
# not raise: the loop has to survive a failed sync, so the caller records and logs the failure.
RunSync = Callable[[list[Path] | None], Awaitable[bool]]


class SyncScheduler:
    def __init__(self, run_sync: RunSync, debounce_ms: int, *, retry_s: float = 0.0) -> None:
        """``retry_s``: the first wait before a failed sync is retried (0: not retried)."""
        self._run_sync = run_sync
        self._quiet = debounce_ms / 1000
        self._retry_s = retry_s
        self._retry_wait = retry_s
        self._retry: asyncio.TimerHandle | None = None
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
        if self._retry is not None:
            self._retry.cancel()
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
            self._settle(await self._run_sync(paths), whole=paths is None)
            if paths is None and named:
                # A sync of everything scans for regular files only, so a named path that is
                # not one (a symlink planted in a user's folder) was not looked at: it gets its
                # own look next, which records it as skipped. Regular ones cost a stat each.
                self._dirty |= named
                self._idle.clear()
                self._wake.set()

    def _settle(self, ok: bool, *, whole: bool) -> None:
        """After a sync: a success resets the back-off (and a whole one makes a pending retry
        needless); a failure schedules one full retry."""
        if ok:
            self._retry_wait = self._retry_s
            if whole and self._retry is not None:
                self._retry.cancel()
                self._retry = None
            return
        if not self._retry_s or self._stop.is_set() or self._retry is not None:
            return
        wait, self._retry_wait = self._retry_wait, min(RETRY_MAX_S, self._retry_wait * 2)
        log.info("memory.sync.retry_scheduled", in_s=wait)
        self._retry = asyncio.get_running_loop().call_later(wait, self._retry_now)

    def _retry_now(self) -> None:
        self._retry = None
        if not self._stop.is_set():
            self.run_soon()

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
