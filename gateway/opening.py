"""What a node opens before it serves: the session store, the memory service and, on PostgreSQL,
its place in the cluster — each chosen by ``[storage]`` (docs/scaling.md) and closed by whoever
opened it (the app's start stack, or ``recalld memory``).

``storage.backend`` names one :class:`Backend` of :data:`BACKENDS`, looked up once
(:func:`backend_of`): how it opens memory and, on a backend several nodes share, the node's
place among them and the database check behind readiness. The daemon, ``recalld memory`` and
``recalld import`` open through it (the session store through :func:`open_store`, which
``gateway.storage.open_session_store`` dispatches the same way). A third backend is one folder
in ``sessions/`` and ``memory/`` and one entry here.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.config import Config
from gateway.readiness import DatabaseCheck
from gateway.storage import StorageUnavailable, open_session_store, pool_settings
from memory import (
    Embedder,
    Memory,
    MemoryConfig,
    MemoryService,
    MemoryStorageError,
    probe_auto_embedder,
    select_embedder,
)
from sessions import FileIO, SchemaTooNew, SessionsConfig, SessionStoreLike

if TYPE_CHECKING:
    from gateway.cluster import ClusterNode

__all__ = ["BACKENDS", "Backend", "backend_of", "close_memory", "close_store",
           "effective_memory_config", "open_memory", "open_store", "page_capped"]


@dataclass(frozen=True, slots=True)
class Backend:
    """One ``storage.backend``: how a node opens what lives in it."""

    name: str
    # The started memory service for [memory] ``cfg``, with its embedder and the reason for it,
    # and whether it may make its embedder the index's (open_memory's ``decides_embedder``).
    open_memory: Callable[[Config, MemoryConfig, Embedder | None, str, bool], Awaitable[Memory]]
    # A backend several nodes share: the node's bus, keys and leases, and the database check
    # behind gateway.health's storage and GET /readyz. None on a backend of one node.
    join_cluster: Callable[[Config, SessionStoreLike], Awaitable[ClusterNode]] | None = None
    database_check: Callable[[Config], DatabaseCheck] | None = None


def page_capped(config: Config) -> SessionsConfig:
    """``[sessions]`` with ``max_page_bytes`` at most a quarter of ``limits.max_reply_bytes``,
    so that one history page always fits a reply, with room for a few in one batch."""
    cap = min(config.sessions.max_page_bytes, max(1, config.limits.max_reply_bytes // 4))
    return dataclasses.replace(config.sessions, max_page_bytes=cap)


def effective_memory_config(config: Config) -> MemoryConfig:
    """``[memory]`` with the embeddings endpoint and key inherited from ``[llm]``, so one
    OpenAI-compatible server (``OPENAI_BASE_URL``/``OPENAI_API_KEY``) serves both."""
    m = config.memory
    return dataclasses.replace(
        m,
        embeddings_base_url=m.embeddings_base_url or config.llm.base_url,
        embeddings_api_key=m.embeddings_api_key or config.llm.api_key,
    )


async def open_memory(config: Config, *, watch: bool = True, catch_up: bool = True,
                      embedder: tuple[Embedder | None, str] | None = None,
                      decides_embedder: bool = True) -> Memory:
    """The started memory service of ``config``, with the embedder ``memory.embedder`` picks —
    or ``embedder`` (the embedder and the reason status gives), which benchmarks pass. On
    ``storage.backend = "postgres"`` it is :class:`memory.PgMemory` on ``storage.dsn`` (no
    memory.db in the data dir); otherwise :class:`MemoryService`.

    ``decides_embedder`` False (a CLI command): on PostgreSQL the command never changes the
    cluster's recorded embedder; with another one it embeds nothing and leaves new chunks to
    the nodes (on SQLite :func:`gateway.cli.embedder.index_embedder` already picks the
    daemon's). Used by the daemon and by ``recalld memory``; close it with
    :func:`close_memory`.
    """
    cfg = effective_memory_config(config)
    if not watch:
        cfg = dataclasses.replace(cfg, watch=False)
    if embedder is None:
        picked, why = await asyncio.to_thread(select_embedder, cfg)
        embedder = await probe_auto_embedder(cfg, picked, why)
    chosen, reason = embedder
    try:
        service = await backend_of(config).open_memory(config, cfg, chosen, reason,
                                                       decides_embedder)
    except BaseException:
        aclose = getattr(chosen, "aclose", None)  # open_memory made it; nothing else will close it
        if aclose is not None:
            await asyncio.shield(aclose())
        raise
    try:
        await service.start(catch_up=catch_up)
    except BaseException:
        await asyncio.shield(close_memory(service))  # what start() opened before it failed
        raise
    return service


async def _sqlite_memory(config: Config, cfg: MemoryConfig, embedder: Embedder | None,
                         reason: str, decides_embedder: bool) -> Memory:
    return MemoryService(config.data_dir, cfg, embedder, embedder_reason=reason,
                         min_free_bytes=config.sessions.min_free_bytes)


async def _pg_memory(config: Config, cfg: MemoryConfig, embedder: Embedder | None,
                     reason: str, decides_embedder: bool) -> Memory:
    from memory import PgMemory  # psycopg: the postgres extra, loaded only for that backend

    assert config.storage.dsn is not None  # StorageConfig refuses postgres without one
    pool = pool_settings(config.storage)
    try:
        return await PgMemory.open(config.storage.dsn, cfg, embedder, data_dir=config.data_dir,
                                   embedder_reason=reason, max_size=config.storage.pool_size,
                                   connect_timeout_s=config.storage.connect_timeout_s,
                                   call_timeout_s=pool.call_timeout_s,
                                   reconnect_timeout_s=pool.reconnect_timeout_s,
                                   options=pool.options, decides_embedder=decides_embedder)
    except MemoryStorageError as err:
        raise StorageUnavailable("storage.dsn (RECALLD_STORAGE_DSN): the memory tables could not "
                                 f"be opened ({err})") from err


async def close_memory(service: Memory) -> None:
    await service.close()
    # The embedder was made by open_memory, not by the service, so it is closed here.
    aclose = getattr(service.embedder, "aclose", None)
    if aclose is not None:
        await aclose()


def open_store(config: Config, file_io: FileIO | None) -> SessionStoreLike:
    return open_session_store(config.storage, config.data_dir, page_capped(config), file_io=file_io,
                              trust_clean_stop=True)


async def close_store(store: SessionStoreLike) -> None:
    await asyncio.to_thread(store.close)


async def _join_pg_cluster(config: Config, store: SessionStoreLike) -> ClusterNode:
    """Start this node's bus, idempotency keys and run leases on the store's database; a
    server that refuses is StorageUnavailable naming storage.dsn."""
    import psycopg

    from gateway.cluster import ClusterHub, ClusterNode

    s = config.storage
    assert s.dsn is not None  # StorageConfig refuses postgres without one
    pool = pool_settings(s)
    node = ClusterNode(s.dsn, ClusterHub(s.max_outbound_events), store,
                       connect_timeout_s=s.connect_timeout_s, bus_wait_s=s.bus_wait_s,
                       close_flush_s=s.close_flush_s, lease_ttl_s=config.cluster.lease_ttl_s,
                       lease_renew_s=config.cluster.lease_renew_s,
                       call_timeout_s=pool.call_timeout_s,
                       reconnect_timeout_s=pool.reconnect_timeout_s, options=pool.options)
    try:
        await node.start()
    except (psycopg.Error, SchemaTooNew) as err:
        raise StorageUnavailable(
            "storage.dsn (RECALLD_STORAGE_DSN): the cluster tables or LISTEN failed: "
            f"{str(err).strip()}"
        ) from err
    return node


def _pg_check(config: Config) -> DatabaseCheck:
    s = config.storage
    assert s.dsn is not None  # StorageConfig refuses postgres without one
    return DatabaseCheck(s.dsn, interval_s=s.check_interval_s, timeout_s=s.call_timeout_s)


BACKENDS: dict[str, Backend] = {
    "sqlite": Backend("sqlite", _sqlite_memory),
    "postgres": Backend("postgres", _pg_memory, _join_pg_cluster, _pg_check),
}


def backend_of(config: Config) -> Backend:
    """The :class:`Backend` ``storage.backend`` names (the config refuses any other name)."""
    return BACKENDS[config.storage.backend]
