"""The composition root: build every part from one :class:`Config`, start them, stop them in order.

Each part is constructed here with exactly what it uses, so this is the one module that
knows them all; nothing else imports it but the CLI. Shutdown order: stop accepting → close
connections 1001 → let runs finish within ``server.shutdown_grace_s`` → cancel the rest →
flush transcripts → close the index. ``App.close()`` is safe to call twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import os
import time
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import structlog

from gateway.auth import (
    DEFAULT_USER,
    STRONG_TOKEN_CHARS,
    Authenticator,
    load_or_create_token,
    token_path,
)
from gateway.chat import ChatRuns, Hub, create_chat_model
from gateway.config import Config, is_loopback
from gateway.methods import (
    ChatMethods,
    EpisodesMethods,
    FactsMethods,
    ForgetMethods,
    GatewayMethods,
    MemoryMethods,
    SessionsMethods,
    declare_methods,
)
from gateway.private import find_exposed, make_private_dir, set_private_umask
from gateway.retention import RetentionSweeper
from gateway.rpc import Quotas, Registry, RpcCore
from gateway.runtime import client_url, remove_runtime_file, write_runtime_file
from gateway.storage import StorageUnavailable, open_session_store
from gateway.transport import GatewayServer
from memory import Embedder, MemoryConfig, MemoryService, probe_auto_embedder, select_embedder
from sessions import FileIO, SessionsConfig, SessionStore

if TYPE_CHECKING:
    from gateway.cluster import ClusterNode

__all__ = ["App", "DataDirBusy", "close_memory", "effective_memory_config", "open_memory", "start_app"]

log = structlog.get_logger("recalld.app")

# A batched flush that fails on every tick (a disk gone bad) is logged at most this often.
_FLUSH_LOG_INTERVAL_S = 60.0

PLAINTEXT_WARNING = (
    "plain ws:// on a non-loopback address: tokens and every message cross the network "
    "unencrypted, so anyone on the path can read them and reuse the token"
)


def package_version() -> str:
    try:
        return version("recalld")
    except PackageNotFoundError:
        return "0.0.0"


@dataclass(eq=False)
class App:
    """The running daemon: its server, its store, and one handler object per namespace."""

    config: Config
    server: GatewayServer
    store: SessionStore
    runs: ChatRuns
    sessions: SessionsMethods
    chat: ChatMethods
    memory: MemoryMethods | None
    lock_fd: int | None
    retention: RetentionSweeper | None = None  # the daily sweep, when a retention setting is on
    cluster: ClusterNode | None = None  # the other nodes on one database (storage.backend = "postgres")
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _closed: bool = False

    @property
    def url(self) -> str:
        return self.server.url

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.server.close()
        await self.runs.drain(self.config.server.shutdown_grace_s)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.cluster is not None:
            await self.cluster.close()
        await asyncio.to_thread(self.store.close)
        if self.memory is not None:
            await close_memory(self.memory.service)
        if self.lock_fd is not None:
            remove_runtime_file(self.config.data_dir)
            os.close(self.lock_fd)  # releases the data dir lock
            self.lock_fd = None
        log.info("app.closed")

    async def _flush_loop(self) -> None:
        # fsync="batch": transcripts reach the disk at least once a second. One failed pass
        # (EIO, EMFILE under a descriptor flood) must not end the loop: later writes would
        # never be synced. The store keeps what it could not open dirty for the next pass;
        # a failure that repeats every tick is logged once per _FLUSH_LOG_INTERVAL_S.
        interval = self.config.sessions.fsync_interval_s
        unlogged = 0  # failures since the last warning
        last_warning = float("-inf")
        warned = False  # a warning went out and no pass has succeeded since
        while True:
            await asyncio.sleep(interval)
            try:
                await asyncio.to_thread(self.store.flush)
            except Exception as exc:  # noqa: BLE001 - any failure of one pass; CancelledError is not one
                unlogged += 1
                now = time.monotonic()
                if now - last_warning >= _FLUSH_LOG_INTERVAL_S:
                    log.warning("sessions.flush_failed", error=str(exc), error_type=type(exc).__name__,
                                failures=unlogged)
                    last_warning, unlogged, warned = now, 0, True
                continue
            if warned:
                log.info("sessions.flush_recovered", unlogged_failures=unlogged)
                warned = False
            unlogged = 0


def _page_capped(config: Config) -> SessionsConfig:
    """``[sessions]`` with ``max_page_bytes`` at most a quarter of ``limits.max_reply_bytes``,
    so that one history page always fits a reply, with room for a few in one batch."""
    cap = min(config.sessions.max_page_bytes, max(1, config.limits.max_reply_bytes // 4))
    return dataclasses.replace(config.sessions, max_page_bytes=cap)


class DataDirBusy(OSError):
    """Another daemon already serves this data dir."""


def _lock_data_dir(data_dir: Path) -> int:
    # Two daemons appending to the same transcripts would interleave runs and fight over the
    # index; an flock held for the daemon's life makes the second one refuse to start.
    fd = os.open(data_dir / "daemon.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DataDirBusy(f"another recalld daemon is already using {data_dir}") from None
    return fd


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
                      embedder: tuple[Embedder | None, str] | None = None) -> MemoryService:
    """The started memory service of ``config``, with the embedder ``memory.embedder`` picks —
    or ``embedder`` (the embedder and the reason status gives), which benchmarks pass.

    Used by the daemon and by ``recalld memory``; close it with :func:`close_memory`.
    """
    cfg = effective_memory_config(config)
    if not watch:
        cfg = dataclasses.replace(cfg, watch=False)
    if embedder is None:
        picked, why = await asyncio.to_thread(select_embedder, cfg)
        embedder = await probe_auto_embedder(cfg, picked, why)
    chosen, reason = embedder
    service = MemoryService(config.data_dir, cfg, chosen, embedder_reason=reason)
    try:
        await service.start(catch_up=catch_up)
    except BaseException:
        await asyncio.shield(close_memory(service))  # what start() opened before it failed
        raise
    return service


async def close_memory(service: MemoryService) -> None:
    await service.close()
    # The embedder was made by open_memory, not by the service, so it is closed here.
    aclose = getattr(service.embedder, "aclose", None)
    if aclose is not None:
        await aclose()


def _authenticator(config: Config) -> Authenticator:
    generated = None
    if config.auth.mode == "token" and not config.auth.token and not config.auth.users:
        generated, created = load_or_create_token(config.data_dir)
        if created:
            log.warning("auth.token_generated", path=str(token_path(config.data_dir)))
        else:
            log.info("auth.token_file", path=str(token_path(config.data_dir)))
    authenticator = Authenticator(config.auth, generated)
    for user in authenticator.weak_token_users:
        log.warning("auth.weak_token", user=user, min_chars=STRONG_TOKEN_CHARS,
                    effect="a lockout refuses this token too; use `python -c 'import secrets; "
                           "print(secrets.token_urlsafe(32))'` for one that is never locked out")
    return authenticator


async def start_app(config: Config, *, file_io: FileIO | None = None,
                    embedder: tuple[Embedder | None, str] | None = None) -> App:
    """Build and start everything; the returned app is listening on ``app.url``.

    ``file_io`` replaces the transcript write/fsync calls (fault-injection tests); ``embedder``
    the embedder that ``memory.embedder`` would pick (benchmarks, see :func:`open_memory`).
    """
    # First, before any file is opened: everything the daemon creates is 0600/0700, the
    # SQLite WAL and SHM files included (gateway.private).
    set_private_umask()
    make_private_dir(config.data_dir)
    # Start-up disk work runs side by side (each a walk or a read of its own): the mode audit
    # of every file, the memory index's own start work (its sign bits, its integrity check;
    # started first, without its catch-up sync), and the sessions store's reconcile of its
    # index with the transcripts. At a million chunks in 82k transcripts one after the other
    # they took 2.1 s before the first search could run (docs/scaling.md).
    audit = asyncio.ensure_future(asyncio.to_thread(_warn_if_exposed, config.data_dir))
    try:
        lock_fd = _lock_data_dir(config.data_dir)
    except BaseException:
        await asyncio.gather(audit, return_exceptions=True)
        raise
    # Each opening is a future awaited through a shield: a cancelled start still learns what
    # was opened (a thread cannot be stopped half-way) and closes it.
    opening_memory: asyncio.Future[MemoryService] | None = None
    opening_store: asyncio.Future[SessionStore] | None = None
    try:
        authenticator = _authenticator(config)
        if config.memory.enabled:
            opening_memory = asyncio.ensure_future(open_memory(config, embedder=embedder, catch_up=False))
            await asyncio.shield(opening_memory)
        # Opening the store reconciles its index with the transcripts (or connects to
        # PostgreSQL and migrates): blocking work, off the loop.
        opening_store = asyncio.ensure_future(asyncio.to_thread(_open_store, config, file_io))
        store = await asyncio.shield(opening_store)
        await audit
        cluster = await _join_cluster(config, store) if config.storage.backend == "postgres" else None
    except BaseException:
        try:
            await asyncio.shield(_undo_start(audit, opening_memory, opening_store))
        finally:
            os.close(lock_fd)
        raise
    service = opening_memory.result() if opening_memory is not None else None
    if service is not None:
        service.catch_up()  # after the reconcile: it may cut a torn transcript tail
    else:
        log.info("memory.disabled")
    llm = config.llm
    model = create_chat_model(
        base_url=llm.base_url, api_key=llm.api_key, model=llm.model,
        timeout_s=llm.timeout_s, connect_timeout_s=llm.connect_timeout_s, max_retries=llm.max_retries,
    )
    hub = Hub() if cluster is None else cluster.hub
    quotas = config.quotas
    runs = ChatRuns(config.chat, llm.model, store, hub, model, service,
                    max_runs=quotas.max_runs, max_runs_per_user=quotas.max_runs_per_user,
                    gate=None if cluster is None else cluster.runs)
    registry = Registry()
    core = RpcCore(registry, max_batch=config.limits.max_batch, on_crash=_log_crash,
                   auth_timeout_s=config.auth.timeout_s,
                   batch_reserve=_page_capped(config).max_page_bytes,
                   quotas=Quotas(
                       per_minute={"sessions.create": (quotas.sessions_per_minute, "quotas.sessions_per_minute"),
                                   "sessions.update": (quotas.updates_per_minute, "quotas.updates_per_minute"),
                                   "memory.facts.add": (quotas.updates_per_minute, "quotas.updates_per_minute")},
                       in_flight={"memory.search": (quotas.max_searches_per_user, "quotas.max_searches_per_user")},
                   ))
    app_version = package_version()
    server = GatewayServer(config, core, authenticator, version=app_version, on_disconnect=hub.drop)
    sessions = SessionsMethods(store, hub, runs, service)
    chat = ChatMethods(config.chat, store, hub, runs)
    memory = MemoryMethods(
        service, store, admin=_memory_admin(config),
        full_reindex_interval_s=config.limits.full_reindex_interval_s,
    ) if service is not None else None
    gateway = GatewayMethods(authenticator, registry, server, app_version, service)
    facts = FactsMethods(service) if service is not None else None
    forget = ForgetMethods(service, store) if service is not None else None
    episodes = EpisodesMethods(service) if service is not None else None
    declare_methods(registry, config, gateway=gateway, sessions=sessions, chat=chat, memory=memory, facts=facts,
                    forget=forget, episodes=episodes)
    app = App(config, server, store, runs, sessions, chat, memory, lock_fd, cluster=cluster)
    if config.sessions.fsync == "batch":
        app._tasks.append(asyncio.create_task(app._flush_loop()))
    if runs.episodes.enabled:
        app._tasks.append(asyncio.create_task(runs.episodes.run()))
    sweeper = RetentionSweeper(config.data_dir, store, runs, service, sessions_days=config.sessions.retention_days,
                               memory_days=config.memory.retention_days)
    if sweeper.enabled:
        app.retention = sweeper
        app._tasks.append(asyncio.create_task(sweeper.run()))
    try:
        await server.start()
        # For `recalld call`/`chat`: the port may be one the OS picked (--port 0).
        write_runtime_file(config.data_dir, client_url(server.scheme, config.server.host, server.port))
        if server.scheme == "ws" and not is_loopback(config.server.host):
            log.warning("gateway.plaintext_remote", url=server.url, warning=PLAINTEXT_WARNING,
                        fix="set [tls] cert and key, or bind 127.0.0.1 and reach it through an SSH "
                            "tunnel or a TLS reverse proxy (docs/remote.md)")
    except BaseException:
        await app.close()
        raise
    return app


async def _undo_start(audit: asyncio.Future[None], memory: asyncio.Future[MemoryService] | None,
                      store: asyncio.Future[SessionStore] | None) -> None:
    """Wait for whatever a failed start began, and close what it opened (a memory service that
    failed half-way through its own start cleans up after itself)."""
    pending = [f for f in (audit, memory, store) if f is not None]
    await asyncio.gather(*pending, return_exceptions=True)
    if store is not None and not store.cancelled() and store.exception() is None:
        await asyncio.to_thread(store.result().close)
    if memory is not None and not memory.cancelled() and memory.exception() is None:
        await close_memory(memory.result())


def _open_store(config: Config, file_io: FileIO | None) -> SessionStore:
    opened = open_session_store(config.storage, config.data_dir, _page_capped(config), file_io=file_io)
    # PgSessionStore has SessionStore's public API; typed as it until the store Protocol lands.
    return cast(SessionStore, opened)


async def _join_cluster(config: Config, store: SessionStore) -> ClusterNode:
    """Start this node's bus, idempotency keys and run leases on the store's database; a
    server that refuses is StorageUnavailable naming storage.dsn."""
    import psycopg

    from gateway.cluster import ClusterHub, ClusterNode

    assert config.storage.dsn is not None  # StorageConfig refuses postgres without one
    node = ClusterNode(config.storage.dsn, ClusterHub(), cast(Any, store),
                       connect_timeout_s=config.storage.connect_timeout_s)
    try:
        await node.start()
    except psycopg.Error as err:
        raise StorageUnavailable(
            f"storage.dsn (RECALLD_STORAGE_DSN): the cluster tables or LISTEN failed: {str(err).strip()}"
        ) from err
    return node


def _memory_admin(config: Config) -> str | None:
    # Without [[auth.users]] the one user owns everything; with them, only a named admin.
    if config.auth.users:
        return config.auth.admin
    return DEFAULT_USER


def _warn_if_exposed(data_dir: Path) -> None:
    exposed = find_exposed(data_dir)
    if exposed.count:
        log.warning("datadir.exposed", data_dir=str(data_dir), count=exposed.count, paths=list(exposed.paths),
                    fix=exposed.hint(data_dir),
                    detail="other local users can read or write these; transcripts and the "
                           "index hold private conversations")


def _log_crash(exc: BaseException, error_id: str, method: str) -> None:
    log.error("rpc.crash", error_id=error_id, method=method, exc_info=exc)
