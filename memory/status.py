"""What ``memory.status`` reports that the service does not compute elsewhere: the row counts,
the size of the index files, and the record of syncs (:class:`SyncLog`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import apsw
import structlog

from memory.reports import SyncReport

__all__ = ["DB_NAME", "SyncLog", "count_rows", "db_bytes"]

log = structlog.get_logger("memory.service")

DB_NAME = "memory.db"


def count_rows(db: apsw.Connection, user: str | None) -> dict[str, int]:
    """Files, chunks, embedded and pending chunks (``user``'s, or all with the embedding cache)."""
    def q(sql: str, *args: str) -> int:
        row = db.execute(sql, args).fetchone()
        return int(row[0]) if row is not None else 0

    if user is not None:
        return {
            "files": q("SELECT count(*) FROM files WHERE user = ?", user),
            "chunks": q("SELECT count(*) FROM chunks WHERE user = ?", user),
            "embedded": q("SELECT count(*) FROM chunks WHERE user = ? AND embedded = 1", user),
            "pending": q("SELECT count(*) FROM chunks WHERE user = ? AND embedded = 0", user),
        }
    return {
        "files": q("SELECT count(*) FROM files"),
        "chunks": q("SELECT count(*) FROM chunks"),
        "embedded": q("SELECT count(*) FROM chunks WHERE embedded = 1"),
        "pending": q("SELECT count(*) FROM chunks WHERE embedded = 0"),
        "cacheEntries": q("SELECT count(*) FROM embedding_cache"),
    }


def db_bytes(data_dir: Path) -> int:
    """memory.db with its -wal and -shm (files moved aside as corrupt are not counted)."""
    return sum(p.stat().st_size for p in data_dir.glob(DB_NAME + "*") if p.is_file()
               and ".corrupt-" not in p.name)


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
