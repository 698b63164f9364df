"""The daily retention sweep: expired chunks and facts (``memory.retention_days``) and whole
transcripts (``sessions.retention_days``), both off by default.

One task, started by the app when either setting is on: a first sweep shortly after start, then
one every ``SWEEP_INTERVAL_S``. Each sweep is one ``retention.sweep`` log line with what it
removed; ``memory.status`` shows ``retention {days, sessionsDays, lastSweep, nextSweep,
lastRemoved, lastError}``. A failed sweep is logged and retried at the next interval, never
fatal. A session is deleted exactly as ``sessions.delete`` does it: its runs aborted, the
session removed from the store, its index rows dropped. The sessions come from the store
(``idle_sessions``, a page at a time), so the sweep is the same on every backend.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol

import structlog

from memory import Memory
from sessions import SessionNotFound, SessionStoreLike, parse_ts

__all__ = ["FIRST_SWEEP_DELAY_S", "SWEEP_INTERVAL_S", "SWEEP_PAGE", "RetentionSweeper"]

log = structlog.get_logger("recalld.retention")

SWEEP_INTERVAL_S = 86_400.0
# Not at the very start: the catch-up sync and the first connections come first.
FIRST_SWEEP_DELAY_S = 60.0
# Idle sessions asked of the store at a time (at most sessions.idle.MAX_IDLE_PAGE), so a huge
# store is never read whole.
SWEEP_PAGE = 100


class SessionRuns(Protocol):
    """What the sweep needs of the chat runs (``ChatRuns``): stopping a session's runs."""

    async def abort_session(self, user: str, session_key: str) -> None: ...


class RetentionSweeper:
    def __init__(self, store: SessionStoreLike, runs: SessionRuns, memory: Memory, *,
                 sessions_days: int, memory_days: int, first_delay_s: float = FIRST_SWEEP_DELAY_S,
                 interval_s: float = SWEEP_INTERVAL_S, page: int = SWEEP_PAGE) -> None:
        self.store = store
        self.runs = runs
        self.memory = memory
        self.sessions_days = sessions_days
        self.memory_days = memory_days
        self.first_delay_s = first_delay_s
        self.interval_s = interval_s
        self.page = page
        self.sweeps = 0

    @property
    def enabled(self) -> bool:
        return self.sessions_days > 0 or (self.memory.config.enabled and self.memory_days > 0)

    async def run(self) -> None:
        """The loop; cancel it to stop."""
        delay = self.first_delay_s
        while True:
            self._note(next_at=time.time() + delay)
            await asyncio.sleep(delay)
            delay = self.interval_s
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the next sweep retries; the daemon goes on
                log.exception("retention.failed")
                self._note(error=f"{type(exc).__name__}: {exc}")

    async def sweep(self, now: datetime | None = None) -> dict[str, int]:
        """One sweep now; returns what it removed."""
        now = now or datetime.now(UTC)
        removed = {"sessions": 0, "chunks": 0, "facts": 0}
        if self.sessions_days > 0:
            removed["sessions"] = await self._sweep_sessions(
                now - timedelta(days=self.sessions_days))
        if self.memory_days > 0:
            removed.update(await self.memory.sweep_retention(int(now.timestamp() * 1000)))
        self.sweeps += 1
        log.info("retention.sweep", **removed, memory_days=self.memory_days,
                 sessions_days=self.sessions_days)
        self._note(last=now, removed=removed)
        return removed

    async def _sweep_sessions(self, cutoff: datetime) -> int:
        deleted = 0
        after: tuple[str, str] | None = None
        while True:
            idle = await asyncio.to_thread(self.store.idle_sessions, cutoff, limit=self.page,
                                           after=after)
            for user, key in idle:
                deleted += await self._delete_idle(user, key, cutoff)
            if len(idle) < self.page:
                return deleted
            after = idle[-1]  # keyset paging: a session skipped below is not asked for again

    async def _delete_idle(self, user: str, key: str, cutoff: datetime) -> int:
        try:
            # Asked again: a message may have arrived since the page was read.
            session = await asyncio.to_thread(self.store.get, user, key)
            if parse_ts(session.updated_at) >= cutoff:
                return 0
            await self.runs.abort_session(user, key)
            await asyncio.to_thread(self.store.delete, user, key)
        except SessionNotFound:
            return 0  # deleted meanwhile, or unreadable (the store logged it)
        await self.memory.delete_session(user, key)
        return 1

    def _note(self, *, next_at: float | None = None, last: datetime | None = None,
              removed: dict[str, int] | None = None, error: str | None = None) -> None:
        status = self.memory.retention_status
        status["sessionsDays"] = self.sessions_days
        if next_at is not None:
            status["nextSweep"] = datetime.fromtimestamp(next_at, UTC).isoformat()
        if last is not None:
            status["lastSweep"] = last.isoformat()
            status["lastError"] = None
        if removed is not None:
            status["lastRemoved"] = removed
        if error is not None:
            status["lastError"] = error
