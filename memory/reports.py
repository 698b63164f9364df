"""What a sync reports, on either backend: :class:`SyncReport` (what one sync did),
:class:`SyncProgress` (passed to a :data:`ProgressCallback` while it runs) and :class:`SyncLog`
(how the syncs went, for ``memory.status``).

Plain values with no storage behind them, so :mod:`memory.protocols` and both indexers
(:mod:`memory.sqlite.index.indexing` over SQLite, :mod:`memory.pg.service` over PostgreSQL) import
them from here rather than from each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog

__all__ = ["ProgressCallback", "SyncLog", "SyncProgress", "SyncReport"]

# The sync log keeps the name it logged under before the backends had folders of their own.
log = structlog.get_logger("memory.service")


@dataclass(slots=True)
class SyncReport:
    """What one sync did."""

    files_scanned: int = 0
    files_changed: int = 0
    files_deleted: int = 0
    files_skipped: int = 0
    chunks_written: int = 0
    chunks_deleted: int = 0
    embedded: int = 0
    cache_hits: int = 0
    embedder_calls: int = 0
    pending: int = 0
    error: str | None = None
    duration_ms: float = 0.0

    def merge(self, other: SyncReport) -> None:
        for name in ("files_scanned", "files_changed", "files_deleted", "files_skipped",
                     "chunks_written", "chunks_deleted", "embedded", "cache_hits",
                     "embedder_calls"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass(frozen=True, slots=True)
class SyncProgress:
    """Passed to a progress callback (on the event loop) after each file and each batch."""

    phase: str            # "files" | "embedding"
    files_done: int
    files_total: int
    chunks_written: int
    embedded: int
    pending: int


ProgressCallback = Callable[[SyncProgress], None]


@dataclass(slots=True)
class SyncLog:
    """Whether a sync runs now, how many ran, and how the last one ended."""

    syncing: bool = False
    count: int = 0
    last_sync: str | None = None
    last_report: SyncReport | None = None
    last_error: str | None = None

    def record(self, report: SyncReport) -> None:
        self.count += 1
        self.last_sync = datetime.now(UTC).isoformat()
        self.last_report = report
        self.last_error = report.error
        if report.files_changed or report.files_deleted or report.embedded or report.error:
            log.info("memory.sync", files=report.files_scanned, changed=report.files_changed,
                     deleted=report.files_deleted, chunks=report.chunks_written,
                     embedded=report.embedded, cache_hits=report.cache_hits, pending=report.pending,
                     ms=round(report.duration_ms, 1), error=report.error)

    def wire(self) -> dict[str, Any]:
        report = self.last_report
        return {
            "syncing": self.syncing,
            "syncCount": self.count,
            "lastSync": self.last_sync,
            "lastSyncMs": round(report.duration_ms, 1) if report else None,
            "lastError": self.last_error,
        }
