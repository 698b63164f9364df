"""The seams a second backend plugs into: what the gateway (and the episode writer) call of memory.

:class:`Memory` is the service surface — life cycle, syncing, the one context call of a chat
run, search, status, forgetting — with :class:`FactsMemory` and :class:`EpisodesMemory` for
the user's facts and episodes. Today :class:`~memory.sqlite.service.MemoryService` (SQLite FTS5 and
sqlite-vec, with :class:`~memory.facts.Facts` and :class:`~memory.episodes.Episodes`)
implements all three; a PostgreSQL backend implements the same surface. The Protocols carry
no SQL and name only value types (``SearchResponse``, ``FactChange``, ``Episode``…).
"""

from __future__ import annotations

from datetime import datetime, tzinfo
from typing import Any, Protocol

from memory.config import MemoryConfig
from memory.context import MemoryContext, RunMemory
from memory.embedders.base import Embedder
from memory.episodes.values import Episode, EpisodeDraft, EpisodeJob, ScoredEpisode
from memory.facts.values import Fact, FactChange, FactsPage
from memory.forget_range import ForgetRange
from memory.reports import ProgressCallback, SyncReport
from memory.retrieval.request import SearchHit, SearchResponse, ShownHistory

__all__ = ["EpisodesMemory", "FactsMemory", "Memory"]


class FactsMemory(Protocol):
    """The user's remembered facts (docs/memory.md, "Facts")."""

    async def add(self, user: str, text: str, *, source: str, replaces: int | None = None,
                  session_key: str | None = None, run_id: str | None = None,
                  client: str | None = None) -> FactChange: ...

    async def update(self, user: str, fact_id: int, text: str, *,
                     client: str | None = None) -> FactChange: ...

    async def delete(self, user: str, fact_id: int) -> FactChange: ...

    async def page(self, user: str, *, limit: int, before: int | None = None,
                   include_inactive: bool = False) -> FactsPage: ...

    async def history(self, user: str, fact_id: int) -> list[Fact]: ...


class EpisodesMemory(Protocol):
    """The user's episodes (docs/memory.md, "Episodes"): what the gateway reads, and the jobs
    and rows the episode writer works with."""

    async def embed(self, text: str) -> list[float] | None: ...

    async def write(self, draft: EpisodeDraft, merge_into: int | None) -> Episode: ...

    async def closest(self, user: str, vector: list[float]) -> tuple[Episode, float] | None: ...

    async def last_of_session(self, user: str, session_key: str) -> Episode | None: ...

    async def count_since(self, user: str, since_ms: int) -> int: ...

    async def enqueue(self, user: str, session_key: str) -> None: ...

    async def due(self) -> list[EpisodeJob]: ...

    async def job_done(self, job_id: int) -> None: ...

    async def job_failed(self, job: EpisodeJob, error: str, retry_s: float,
                         max_attempts: int) -> bool: ...

    async def page(self, user: str, *, limit: int,
                   before: int | None) -> tuple[list[Episode], int | None]: ...

    async def queue_state(self) -> dict[str, int]: ...

    async def search(self, user: str, query: str, *, limit: int,
                     window: tuple[int, int] | None = None, recency: float = 0.0,
                     half_life_days: float = 30.0) -> list[ScoredEpisode]: ...


class Memory(Protocol):
    """The memory service (docs/architecture.md, "Seams")."""

    @property
    def config(self) -> MemoryConfig: ...

    @property
    def embedder(self) -> Embedder | None: ...

    @property
    def embedder_reason(self) -> str: ...

    @property
    def sync_count(self) -> int: ...

    # Set by whoever schedules the retention sweep; shown by status().
    retention_status: dict[str, Any]

    @property
    def facts(self) -> FactsMemory: ...

    @property
    def episodes(self) -> EpisodesMemory: ...

    # --- life cycle and syncing
    async def start(self, *, catch_up: bool = True) -> None: ...

    async def close(self) -> None: ...

    def catch_up(self) -> None: ...

    def nudge(self) -> None:
        """Ask for a sync soon; returns at once, coalesces (the SQLite service also takes a
        transcript's path, for its file watcher)."""

    async def sync_now(self, progress: ProgressCallback | None = None, *,
                       full: bool = False) -> SyncReport: ...

    async def reindex(self, full: bool = False, *, user: str | None = None) -> None: ...

    # --- reading
    async def context(self, user: str, message: str, run: RunMemory, *, k: int, shown: ShownHistory,
                      tz: tzinfo) -> MemoryContext: ...

    async def search(self, user: str, query: str, *, k: int | None = None, mode: str = "hybrid",
                     session_key: str | None = None, exclude_session_key: str | None = None,
                     after: str | None = None, before: str | None = None,
                     now: datetime | None = None, recency: bool = False,
                     shown: ShownHistory | None = None) -> SearchResponse: ...

    async def recall(self, user: str, message: str, *, k: int,
                     exclude_session_key: str | None = None, now: datetime | None = None,
                     shown: ShownHistory | None = None) -> list[SearchHit]: ...

    async def status(self, user: str | None = None) -> dict[str, Any]: ...

    # --- forgetting
    async def delete_session(self, user: str, session_key: str) -> int: ...

    async def forget(self, r: ForgetRange, *, record: bool) -> dict[str, int]: ...

    async def sweep_retention(self, now_ms: int | None = None) -> dict[str, int]: ...
