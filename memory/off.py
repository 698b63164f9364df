"""The :class:`~memory.protocols.Memory` of a daemon run with ``memory.enabled = false``.

A node without memory is an object, not a branch: the gateway holds a :class:`MemoryOff` and
calls it as it calls either backend. What keeps nothing does nothing (``nudge``, ``catch_up``,
``delete_session``, ``forget``, a retention sweep); a run's :class:`~memory.context.RunMemory`
is decided all off from its config (``enabled = false``), so ``context`` is never asked; what
can only answer with memory (a search, its facts and episodes) raises
:class:`~memory.errors.MemoryUnavailable`. The gateway reads ``config.enabled`` only where the
wire differs: the memory methods it declares, ``gateway.health``'s ``memory.enabled``.
"""

from __future__ import annotations

from datetime import datetime, tzinfo
from typing import Any, NoReturn

from memory.config import MemoryConfig
from memory.context import MemoryContext, RunMemory
from memory.embedders.base import Embedder
from memory.errors import MemoryUnavailable
from memory.forget_range import ForgetRange
from memory.protocols import EpisodesMemory, FactsMemory
from memory.reports import ProgressCallback, SyncReport
from memory.retrieval.request import SearchHit, SearchResponse, ShownHistory

__all__ = ["MEMORY_OFF_REASON", "MemoryOff"]

MEMORY_OFF_REASON = "memory is off on this gateway (memory.enabled = false)"


def _off() -> NoReturn:
    raise MemoryUnavailable(MEMORY_OFF_REASON)


class MemoryOff:
    """Memory that keeps nothing and recalls nothing."""

    def __init__(self) -> None:
        # Off in every part, so nothing built from this config turns a part on.
        self._config = MemoryConfig(enabled=False, episodes=False)
        self.retention_status: dict[str, Any] = {}

    @property
    def config(self) -> MemoryConfig:
        return self._config

    @property
    def embedder(self) -> Embedder | None:
        return None

    @property
    def embedder_reason(self) -> str:
        return MEMORY_OFF_REASON

    @property
    def sync_count(self) -> int:
        return 0

    @property
    def facts(self) -> FactsMemory:
        _off()

    @property
    def episodes(self) -> EpisodesMemory:
        _off()

    async def start(self, *, catch_up: bool = True) -> None:
        return None

    async def close(self) -> None:
        return None

    def catch_up(self) -> None:
        return None

    def nudge(self) -> None:
        return None

    async def sync_now(self, progress: ProgressCallback | None = None, *,
                       full: bool = False) -> SyncReport:
        return SyncReport()

    async def reindex(self, full: bool = False, *, user: str | None = None) -> None:
        _off()

    async def context(self, user: str, message: str, run: RunMemory, *, k: int, shown: ShownHistory,
                      tz: tzinfo) -> MemoryContext:
        return MemoryContext()

    async def search(self, user: str, query: str, *, k: int | None = None, mode: str = "hybrid",
                     session_key: str | None = None, exclude_session_key: str | None = None,
                     after: str | None = None, before: str | None = None,
                     now: datetime | None = None, recency: bool = False,
                     shown: ShownHistory | None = None) -> SearchResponse:
        _off()

    async def recall(self, user: str, message: str, *, k: int,
                     exclude_session_key: str | None = None, now: datetime | None = None,
                     shown: ShownHistory | None = None) -> list[SearchHit]:
        return []

    async def status(self, user: str | None = None) -> dict[str, Any]:
        _off()

    async def delete_session(self, user: str, session_key: str) -> int:
        return 0

    async def forget(self, r: ForgetRange, *, record: bool) -> dict[str, int]:
        return {}

    async def sweep_retention(self, now_ms: int | None = None) -> dict[str, int]:
        return {}
