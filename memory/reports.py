"""What a sync reports, on either backend: :class:`SyncReport` (what one sync did) and
:class:`SyncProgress` (passed to a :data:`ProgressCallback` while it runs).

Plain values with no storage behind them, so :mod:`memory.protocols` and both indexers
(:mod:`memory.index.indexing` over SQLite, :mod:`memory.pg.service` over PostgreSQL) import
them from here rather than from each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ProgressCallback", "SyncProgress", "SyncReport"]


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
        for name in ("files_scanned", "files_changed", "files_deleted", "files_skipped", "chunks_written",
                     "chunks_deleted", "embedded", "cache_hits", "embedder_calls"):
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
