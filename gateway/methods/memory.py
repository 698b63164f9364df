"""``memory.search``, ``memory.status`` and ``memory.reindex`` over the :class:`MemoryService`.

``k`` is bounded by the same ``memory.max_k`` the service enforces. When ``memory.enabled`` is
false the methods are still declared (``rpc.discover`` lists them) and answer -32601.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NotRequired, TypedDict, cast

from gateway.errors import InvalidParams, RateLimited
from gateway.methods.sessions import MAX_KEY
from gateway.rpc import Bound, CallContext, Registry, bounded
from gateway.wire import SearchHitWire, search_wire
from memory import MAX_QUERY_CHARS, Memory, MemoryConfig
from sessions import SessionStoreLike, parse_ts

__all__ = ["SEARCH_QUERY_MAX_CHARS", "MemoryMethods", "declare_memory"]

# The longest query memory searches with (it would cut a longer one silently); refusing
# longer ones on the wire makes that visible.
SEARCH_QUERY_MAX_CHARS = MAX_QUERY_CHARS


@dataclass(frozen=True, slots=True)
class Empty:
    pass


@dataclass(frozen=True, slots=True)
class MemorySearchParams:
    query: str = bounded(max_len=SEARCH_QUERY_MAX_CHARS)
    k: int | None = bounded(None, min=1)
    mode: Literal["hybrid", "keyword", "vector"] = "hybrid"
    session_key: str | None = bounded(None, max_len=MAX_KEY)
    exclude_session_key: str | None = bounded(None, max_len=MAX_KEY)
    after: str | None = bounded(None, max_len=64, doc="ISO-8601 lower bound on chunk time")
    before: str | None = bounded(None, max_len=64, doc="ISO-8601 upper bound on chunk time")
    kinds: tuple[Literal["chunk", "episode"], ...] = bounded(
        ("chunk",),
        doc='what to search: "chunk" (conversation excerpts), "episode" (summaries), or both')


@dataclass(frozen=True, slots=True)
class ReindexParams:
    full: bool = False


class EpisodeHit(TypedDict):
    """An episode among ``memory.search``'s results (``kinds`` with "episode")."""

    kind: Literal["episode"]
    episodeId: int
    sessionKey: str
    content: str
    score: float
    date: str
    week: str


class SearchReply(TypedDict):
    results: list[SearchHitWire | EpisodeHit]  # the chunk hits, then the episode hits
    mode: str  # the mode actually run
    fallbackReason: NotRequired[str]
    previousModel: NotRequired[str]  # during a rebuild: the model whose
                                     # vectors ranked the vector leg


class EmbedderName(TypedDict):
    provider: str
    model: str


class VectorBackendState(TypedDict):
    available: bool
    reason: str


class VectorRebuildState(TypedDict):
    embedded: int
    total: int
    previous: EmbedderName | None
    previousUnavailable: str | None


class VectorSearchState(TypedDict):
    ready: bool
    reason: str | None
    servedBy: EmbedderName | None  # whose vectors answer the vector leg now
    rebuild: VectorRebuildState | None  # only while an embedder change is being rebuilt


class RemovedCounts(TypedDict):
    sessions: int
    chunks: int
    facts: int


class RetentionState(TypedDict):
    days: int
    # Set by the retention sweep when a retention setting is on (docs/memory.md, "Retention").
    sessionsDays: NotRequired[int]
    nextSweep: NotRequired[str]
    lastSweep: NotRequired[str]
    lastRemoved: NotRequired[RemovedCounts]
    lastError: NotRequired[str | None]


class StatusReply(TypedDict):
    """``memory.status``: the caller's rows (``scope: "user"``) or the whole index (``"all"``)."""

    files: int
    chunks: int
    embedded: int
    pending: int
    provider: str
    model: str | None
    dims: int | None
    embedderReason: str
    vectorBackend: VectorBackendState
    vectorSearch: VectorSearchState
    syncing: bool
    syncCount: int
    lastSync: str | None
    lastSyncMs: float | None
    lastError: str | None
    rebuiltFromTranscripts: str | None
    scope: Literal["all", "user"]
    retention: RetentionState
    # The whole index only:
    cacheEntries: NotRequired[int]
    skippedFiles: NotRequired[int]
    dbBytes: NotRequired[int]
    dbPath: NotRequired[str]


class QueuedReply(TypedDict):
    queued: Literal[True]


class MemoryMethods:
    """``admin`` sees the whole index and reindexes everyone's: the configured ``auth.admin``,
    or the only user of a daemon without ``[[auth.users]]`` (everything is theirs anyway).
    Anyone else sees and rebuilds only their own rows."""

    def __init__(self, service: Memory, store: SessionStoreLike, *, admin: str | None = None,
                 full_reindex_interval_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.service = service
        self.store = store  # to check that a session filter names one of the caller's sessions
        self.admin = admin
        self.full_reindex_interval_s = full_reindex_interval_s
        self._clock = clock
        # User -> when their last full reindex was accepted (one entry per configured user).
        self._last_full: dict[str, float] = {}

    async def search(self, ctx: CallContext, p: MemorySearchParams) -> SearchReply:
        await self._own_session(ctx, p.session_key)
        await self._own_session(ctx, p.exclude_session_key)
        if "chunk" in p.kinds:
            response = await self.service.search(
                ctx.caller, p.query, k=p.k, mode=p.mode, session_key=p.session_key,
                exclude_session_key=p.exclude_session_key, after=p.after, before=p.before,
            )
            out = cast(SearchReply, search_wire(response))  # the same keys, its results widened
        else:
            out = {"results": [], "mode": p.mode}
        if "episode" in p.kinds:
            out["results"] = [*out["results"], *await episode_results(self.service, ctx.caller, p)]
        return out

    async def status(self, ctx: CallContext, p: Empty) -> StatusReply:
        # The memory service still builds this dict itself (its counts and state, camelCase).
        return cast(StatusReply,
                    await self.service.status(None if ctx.caller == self.admin else ctx.caller))

    async def reindex(self, ctx: CallContext, p: ReindexParams) -> QueuedReply:
        if p.full:
            # A full reindex re-reads and re-chunks every transcript in scope: rate-limited.
            now = self._clock()
            last = self._last_full.get(ctx.caller)
            if last is not None and now - last < self.full_reindex_interval_s:
                wait_ms = int((self.full_reindex_interval_s - (now - last)) * 1000) + 1
                raise RateLimited("a full reindex ran less than "
                                  f"{self.full_reindex_interval_s:g} s ago; retry later", wait_ms)
            self._last_full[ctx.caller] = now
        await self.service.reindex(full=p.full,
                                   user=None if ctx.caller == self.admin else ctx.caller)
        return {"queued": True}

    async def _own_session(self, ctx: CallContext, key: str | None) -> None:
        # A key that is not the caller's answers -32002, exactly like sessions.get.
        if key is not None:
            await asyncio.to_thread(self.store.get, ctx.caller, key)


async def episode_results(service: Memory, user: str, p: MemorySearchParams) -> list[EpisodeHit]:
    """Episodes matching the query (``kinds`` with "episode"): up to k, after the chunk hits."""
    window = None
    if p.after is not None or p.before is not None:
        try:
            lo = int(parse_ts(p.after).timestamp() * 1000) if p.after else 0
            hi = int(parse_ts(p.before).timestamp() * 1000) if p.before else 1 << 62
        except ValueError:
            raise InvalidParams("after" if p.after else "before",
                                "must be an ISO-8601 date or time") from None
        window = (lo, hi)
    found = await service.episodes.search(user, p.query, limit=p.k or service.config.default_k,
                                          window=window, recency=0.2)
    return [{"kind": "episode", "episodeId": s.episode.id, "sessionKey": s.episode.session_key,
             "content": s.episode.text, "score": round(s.score, 6), "date": s.episode.day,
             "week": s.episode.week} for s in found
            if p.session_key is None or s.episode.session_key == p.session_key]


def declare_memory(reg: Registry, config: MemoryConfig, h: MemoryMethods | None) -> None:
    reg.declare("memory.search", MemorySearchParams,
                "Hybrid keyword + vector search of your past conversations.",
                h.search if h else None, result=SearchReply, bounds={"k": Bound(max=config.max_k)})
    reg.declare("memory.status", Empty,
                "Index and embedder state (your own rows; the whole index for the admin).",
                h.status if h else None, result=StatusReply)
    reg.declare("memory.reindex", ReindexParams,
                "Queue an index sync (full=true re-reads your transcripts; rate-limited).",
                h.reindex if h else None, result=QueuedReply)
