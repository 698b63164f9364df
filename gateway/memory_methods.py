"""``memory.*`` methods and recall for chat, on top of :class:`memory.service.MemoryService`.

The embeddings endpoint defaults to the chat endpoint (``[llm] base_url``/``api_key``, i.e.
``OPENAI_BASE_URL``/``OPENAI_API_KEY``) when ``[memory]`` does not name its own, so one
OpenAI-compatible server serves both.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING, Any

import structlog

from gateway import schemas
from memory import MemoryConfig, MemoryService, select_embedder

if TYPE_CHECKING:
    from gateway.app import App
    from gateway.config import Config
    from gateway.server import Connection

__all__ = ["MemoryGateway", "attach_memory", "effective_memory_config"]

log = structlog.get_logger("recalld.memory")

# Recall searches with the start of the message: enough words to find related talk, and a
# bound on the work a huge paste can cause.
RECALL_QUERY_CHARS = 2000


def effective_memory_config(config: Config) -> MemoryConfig:
    """``[memory]`` with the embeddings endpoint and key inherited from ``[llm]``."""
    m = config.memory
    return dataclasses.replace(
        m,
        embeddings_base_url=m.embeddings_base_url or config.llm.base_url,
        embeddings_api_key=m.embeddings_api_key or config.llm.api_key,
    )


class MemoryGateway:
    """What the rest of the gateway needs from memory: recall, nudges, health, deletes."""

    def __init__(self, service: MemoryService) -> None:
        self.service = service

    async def recall(self, user: str, session_key: str, query: str, k: int) -> list[dict[str, Any]]:
        response = await self.service.search(
            user, query[:RECALL_QUERY_CHARS], k=k, mode="hybrid", exclude_session_key=session_key
        )
        return [hit.to_wire() for hit in response.results]

    def nudge(self) -> None:
        self.service.nudge()

    async def health(self) -> dict[str, Any]:
        # No database query: gateway.health must stay cheap under load.
        embedder = self.service.embedder
        return {
            "enabled": True,
            "provider": embedder.provider if embedder else "none",
            "syncCount": self.service.sync_count,
        }

    async def delete_session(self, user: str, session_key: str) -> None:
        await self.service.delete_session(user, session_key)

    async def close(self) -> None:
        await close_memory(self.service)


async def open_memory(config: Config, *, watch: bool = True, catch_up: bool = True) -> MemoryService:
    """The started memory service of ``config``, with the embedder ``memory.embedder`` picks.

    Used by the daemon and by ``recalld memory``; close it with :func:`close_memory`.
    """
    cfg = effective_memory_config(config)
    if not watch:
        cfg = dataclasses.replace(cfg, watch=False)
    embedder, reason = await asyncio.to_thread(select_embedder, cfg)
    service = MemoryService(config.data_dir, cfg, embedder, embedder_reason=reason)
    await service.start(catch_up=catch_up)
    return service


async def close_memory(service: MemoryService) -> None:
    await service.close()
    # The embedder was made by open_memory, not by the service, so it is closed here.
    aclose = getattr(service.embedder, "aclose", None)
    if aclose is not None:
        await aclose()


async def attach_memory(app: App) -> None:
    if not app.config.memory.enabled:
        log.info("memory.disabled")
        return
    service = await open_memory(app.config)
    memory = MemoryGateway(service)
    app.memory = memory
    store = app.store

    async def own_session(conn: Connection, key: str | None) -> None:
        # A key that is not the caller's answers -32002, exactly like sessions.get.
        if key is not None:
            await asyncio.to_thread(store.get, conn.caller, key)

    async def search(conn: Connection, p: schemas.MemorySearchParams) -> dict[str, Any]:
        await own_session(conn, p.session_key)
        await own_session(conn, p.exclude_session_key)
        response = await service.search(
            conn.caller, p.query, k=p.k, mode=p.mode, session_key=p.session_key,
            exclude_session_key=p.exclude_session_key, after=p.after, before=p.before,
        )
        return response.to_wire()

    async def status(conn: Connection, p: schemas.Empty) -> dict[str, Any]:
        return await service.status()

    async def reindex(conn: Connection, p: schemas.ReindexParams) -> dict[str, Any]:
        await service.reindex(full=p.full)
        return {"queued": True}

    app.registry.implement("memory.search", search)
    app.registry.implement("memory.status", status)
    app.registry.implement("memory.reindex", reindex)
