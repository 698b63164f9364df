"""The composition root: build every part from one :class:`Config`, start them, stop them in order.

Each part is constructed here with exactly what it uses, so this is the one module that
knows them all; nothing else imports it but the CLI. Each part that must be stopped is pushed
on one ``AsyncExitStack`` as it starts, by a small function of its own that ``_start`` calls in
start order, so stop is start reversed, and a start that fails or is cancelled part-way stops
exactly what had started: stop accepting → close connections 1001 → let runs finish within
``server.shutdown_grace_s`` → cancel the background tasks → flush transcripts → close the index
→ release the data dir. ``App.close()`` is safe to call twice.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AsyncExitStack
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from gateway.auth import (
    DEFAULT_USER,
    STRONG_TOKEN_CHARS,
    Authenticator,
    ClientTokens,
    clients_path,
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
from gateway.opening import (
    Backend,
    backend_of,
    close_memory,
    close_store,
    effective_memory_config,
    open_memory,
    open_store,
    page_capped,
)
from gateway.private import (
    find_exposed,
    make_private_dir,
    mark_clean_stop,
    set_private_umask,
    take_clean_stop,
    tighten_private_dir,
)
from gateway.readiness import SQLITE_STATE, DatabaseCheck, StorageState
from gateway.retention import RetentionSweeper
from gateway.rpc import ByteRate, Quotas, Registry, RpcCore, UserSlots, fair_threads
from gateway.runtime import client_url, remove_runtime_file, write_runtime_file
from gateway.transport import GatewayServer, ServerSettings
from memory import Embedder, Memory, MemoryOff
from sessions import FileIO, SessionStoreLike

if TYPE_CHECKING:
    from gateway.cluster import ClusterNode
    from gateway.mcp.http import McpHttpServer

__all__ = ["App", "DataDirBusy", "close_memory", "effective_memory_config", "open_memory",
           "start_app"]

log = structlog.get_logger("recalld.app")

T = TypeVar("T")

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
    """The running daemon: its server, its store, and one handler object per namespace.

    Everything it started is on ``_stack`` in start order, so :meth:`close` stops them in
    exactly the reverse order (gateway.app's docstring)."""

    config: Config
    server: GatewayServer
    store: SessionStoreLike
    runs: ChatRuns
    sessions: SessionsMethods
    chat: ChatMethods
    memory: MemoryMethods | None
    retention: RetentionSweeper | None  # the daily sweep, when a retention setting is on
    _stack: AsyncExitStack
    mcp: McpHttpServer | None = None  # /mcp on [mcp] port, when set
    cluster: ClusterNode | None = None  # the other nodes on one database
                                        # (storage.backend = "postgres")
    _closed: bool = False

    @property
    def url(self) -> str:
        return self.server.url

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._stack.aclose()
        log.info("app.closed")


async def _flush_loop(store: SessionStoreLike, interval_s: float) -> None:
    # fsync="batch": transcripts reach the disk at least once a second. One failed pass
    # (EIO, EMFILE under a descriptor flood) must not end the loop: later writes would
    # never be synced. The store keeps what it could not open dirty for the next pass;
    # a failure that repeats every tick is logged once per _FLUSH_LOG_INTERVAL_S.
    unlogged = 0  # failures since the last warning
    last_warning = float("-inf")
    warned = False  # a warning went out and no pass has succeeded since
    while True:
        await asyncio.sleep(interval_s)
        try:
            await asyncio.to_thread(store.flush)
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


def _authenticator(config: Config) -> Authenticator:
    generated = None
    if config.auth.mode == "token" and not config.auth.token and not config.auth.users:
        generated, created = load_or_create_token(config.data_dir)
        if created:
            log.warning("auth.token_generated", path=str(token_path(config.data_dir)))
        else:
            log.info("auth.token_file", path=str(token_path(config.data_dir)))
    authenticator = Authenticator(config.auth, generated,
                                  ClientTokens(clients_path(config.data_dir)))
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
    A start that fails or is cancelled closes whatever it had started, in reverse order.
    """
    stack = AsyncExitStack()
    try:
        return await _start(stack, config, file_io, embedder)
    except BaseException:
        await asyncio.shield(stack.aclose())
        raise


async def _start(stack: AsyncExitStack, config: Config, file_io: FileIO | None,
                 embedder: tuple[Embedder | None, str] | None) -> App:
    """Start each part onto ``stack``; what is pushed last is stopped first."""
    loose_mode = _private_data_dir(config.data_dir)
    _ration_threads(config)
    audit = _claim_data_dir(stack, config.data_dir)
    authenticator = _authenticator(config)
    backend = backend_of(config)  # storage.backend, chosen once
    service = await _open_memory(stack, config, embedder)
    # Opening the store reconciles its index with the transcripts: disk work, off the loop.
    store = await _opened(stack, asyncio.to_thread(open_store, config, file_io), close_store)
    await _audited(config.data_dir, audit, loose_mode)
    cluster = await _join_cluster(stack, backend, config, store)
    check = _database_check(stack, backend, config)
    service.catch_up()  # after the reconcile: it may cut a torn transcript tail
    hub = Hub() if cluster is None else cluster.hub
    runs = _chat_runs(config, store, hub, service, cluster)
    sweeper = _start_background(stack, config, store, runs, service)
    # Runs finish (within the grace period) before the background tasks and the store stop.
    stack.push_async_callback(runs.drain, config.server.shutdown_grace_s)
    registry = Registry()
    core = _rpc_core(config, registry)
    app_version = package_version()
    server = _server(config, core, authenticator, app_version, hub,
                     check.unready_reason if check is not None else lambda: None)
    sessions, chat, memory = _declare_handlers(
        registry, config, store, hub, runs, service, authenticator, server, app_version,
        (lambda: check.state) if check is not None else (lambda: SQLITE_STATE))
    await _listen(stack, config, server, service)
    mcp = await _start_mcp(stack, config, authenticator, app_version, server)
    return App(config, server, store, runs, sessions, chat, memory,
               sweeper if sweeper.enabled else None, stack.pop_all(), mcp, cluster)


def _ration_threads(config: Config) -> None:
    """Ration the loop's worker threads per user, before any job goes to one.

    This is where every ``asyncio.to_thread`` of the daemon is rationed: sessions/ and memory/
    stay plain asyncio (usable without the gateway) and hand blocking work to the loop's default
    executor, which becomes a :class:`gateway.rpc.FairThreads` here: at most
    ``limits.max_user_threads`` jobs of the calling user (``gateway.rpc.CALLER``, set by the RPC
    core for each call) run at once, the rest wait in that user's queue; work of no call (the
    indexer, start-up) is not rationed. docs/architecture.md, "Worker threads".
    """
    fair_threads(config.limits.max_user_threads)


def _private_data_dir(data_dir: Path) -> int | None:
    """The data dir, made owner-only before anything is written into it; its loose mode, if any
    (None: nothing to tighten once the audit has named what others could reach)."""
    # First, before any file is opened: everything the daemon creates is 0600/0700, the
    # SQLite WAL and SHM files included (gateway.private).
    set_private_umask()
    # A data dir another user owns with group or world access refuses the start here
    # (DataDirExposed, an OSError), before anything is written into it.
    return make_private_dir(data_dir)


def _claim_data_dir(stack: AsyncExitStack, data_dir: Path) -> asyncio.Future[bool]:
    """Start the mode audit and take the data dir's lock; the audit, awaited by :func:`_audited`."""
    # Start-up disk work runs side by side (each a walk or a read of its own): the mode audit
    # of every file, the memory index's own start work (its sign bits, its integrity check;
    # started first, without its catch-up sync), and the sessions store's reconcile of its
    # index with the transcripts (docs/scaling.md).
    audit = asyncio.ensure_future(asyncio.to_thread(_warn_if_exposed, data_dir))
    stack.push_async_callback(_settle, audit)
    lock_fd = _lock_data_dir(data_dir)
    stack.callback(os.close, lock_fd)  # releases the data dir lock
    # Stopped just before the lock is released: the next start may then skip the per-file audit.
    stack.push_async_callback(_mark_clean_stop, audit, data_dir)
    stack.callback(remove_runtime_file, data_dir)  # written once listening
    return audit


async def _open_memory(stack: AsyncExitStack, config: Config,
                       embedder: tuple[Embedder | None, str] | None) -> Memory:
    """The memory service, started without its catch-up sync (:class:`MemoryOff` when off)."""
    if not config.memory.enabled:
        log.info("memory.disabled")
        return MemoryOff()
    opening = open_memory(config, embedder=embedder, catch_up=False)
    return await _opened(stack, opening, close_memory)


async def _audited(data_dir: Path, audit: asyncio.Future[bool], loose_mode: int | None) -> None:
    await audit
    if loose_mode is not None:
        # After the audit, so that it still names the data dir others could reach until now.
        tighten_private_dir(data_dir, loose_mode)
        log.warning("data_dir.tightened", data_dir=str(data_dir), mode=f"{loose_mode:04o}")


async def _join_cluster(stack: AsyncExitStack, backend: Backend, config: Config,
                        store: SessionStoreLike) -> ClusterNode | None:
    """The node among the others on one database (a backend nodes share), else None."""
    if backend.join_cluster is None:
        return None
    cluster = await backend.join_cluster(config, store)  # closes what it opened if it fails
    stack.push_async_callback(cluster.close)  # after the runs drain, before the store closes
    return cluster


def _database_check(stack: AsyncExitStack, backend: Backend,
                    config: Config) -> DatabaseCheck | None:
    """On a shared database, the check behind gateway.health's storage and GET /readyz, running."""
    if backend.database_check is None:
        return None
    check = backend.database_check(config)
    _background(stack, check.run())
    return check


def _chat_runs(config: Config, store: SessionStoreLike, hub: Hub, service: Memory,
               cluster: ClusterNode | None) -> ChatRuns:
    llm, quotas = config.llm, config.quotas
    model = create_chat_model(
        base_url=llm.base_url, api_key=llm.api_key, model=llm.model,
        timeout_s=llm.timeout_s, connect_timeout_s=llm.connect_timeout_s,
        max_retries=llm.max_retries,
    )
    return ChatRuns(config.chat, llm.model, store, hub, model, service,
                    max_runs=quotas.max_runs, max_runs_per_user=quotas.max_runs_per_user,
                    gate=None if cluster is None else cluster.runs, models=llm.choices(),
                    max_temperature=llm.max_temperature, max_tokens_limit=llm.max_tokens_limit,
                    vision_models=llm.vision_models)


def _start_background(stack: AsyncExitStack, config: Config, store: SessionStoreLike,
                      runs: ChatRuns, service: Memory) -> RetentionSweeper:
    """The batched flush, the episode writer and the retention sweep, each when it is on."""
    if config.sessions.fsync == "batch":
        _background(stack, _flush_loop(store, config.sessions.fsync_interval_s))
    if runs.episodes.enabled:
        _background(stack, runs.episodes.run())
    sweeper = RetentionSweeper(store, runs, service, sessions_days=config.sessions.retention_days,
                               memory_days=config.memory.retention_days)
    if sweeper.enabled:
        _background(stack, sweeper.run())
    return sweeper


def _rpc_core(config: Config, registry: Registry) -> RpcCore:
    quotas = config.quotas
    return RpcCore(registry, max_batch=config.limits.max_batch, on_crash=_log_crash,
                   auth_timeout_s=config.auth.timeout_s,
                   reply_reserve=page_capped(config).max_page_bytes,
                   user_slots=UserSlots(config.limits.max_user_running),
                   quotas=Quotas(
                       per_minute={"sessions.create": (quotas.sessions_per_minute,
                                                       "quotas.sessions_per_minute"),
                                   "sessions.update": (quotas.updates_per_minute,
                                                       "quotas.updates_per_minute"),
                                   "memory.facts.add": (quotas.updates_per_minute,
                                                        "quotas.updates_per_minute"),
                                   "memory.facts.update": (quotas.updates_per_minute,
                                                           "quotas.updates_per_minute")},
                       in_flight={"memory.search": (quotas.max_searches_per_user,
                                                    "quotas.max_searches_per_user")},
                   ))


def _declare_handlers(registry: Registry, config: Config, store: SessionStoreLike, hub: Hub,
                      runs: ChatRuns, service: Memory, authenticator: Authenticator,
                      server: GatewayServer, app_version: str, storage: Callable[[], StorageState],
                      ) -> tuple[SessionsMethods, ChatMethods, MemoryMethods | None]:
    """One handler object per namespace, declared on ``registry``; those the app keeps."""
    llm, quotas = config.llm, config.quotas
    # One bucket for what a user writes as messages and as system prompts (issue 33, L1).
    written = ByteRate(quotas.message_bytes_per_minute, "quotas.message_bytes_per_minute",
                       largest=config.chat.max_message_bytes)
    sessions = SessionsMethods(store, hub, runs, service, llm.choices(), written)
    files = ByteRate(quotas.attachment_bytes_per_minute, "quotas.attachment_bytes_per_minute",
                     largest=config.chat.max_attachment_bytes)
    chat = ChatMethods(config.chat, store, hub, runs, written, files)
    # A node without memory declares its methods unhandled: they answer "not available".
    on = service.config.enabled
    memory = MemoryMethods(
        service, store, admin=_memory_admin(config),
        full_reindex_interval_s=config.limits.full_reindex_interval_s,
    ) if on else None
    gateway = GatewayMethods(authenticator, registry, server, app_version, service, llm.choices(),
                             storage=storage)
    facts = FactsMethods(service) if on else None
    forget = ForgetMethods(service, store) if on else None
    episodes = EpisodesMethods(service) if on else None
    declare_methods(registry, config, gateway=gateway, sessions=sessions, chat=chat, memory=memory,
                    facts=facts, forget=forget, episodes=episodes)
    return sessions, chat, memory


async def _listen(stack: AsyncExitStack, config: Config, server: GatewayServer,
                  service: Memory) -> None:
    """Start listening, then write the runtime file that names the URL (and warn on plain ws://)."""
    # Stopped first: no new connection, the open ones closed 1001.
    stack.push_async_callback(server.close)
    await server.start()
    # For `recalld call`/`chat`: the port may be one the OS picked (--port 0).
    indexing = service.embedder
    write_runtime_file(config.data_dir, client_url(server.scheme, config.server.host, server.port),
                       ((indexing.provider, indexing.model_id, indexing.endpoint_hash)
                        if indexing else None))
    if server.scheme == "ws" and not is_loopback(config.server.host):
        log.warning("gateway.plaintext_remote", url=server.url, warning=PLAINTEXT_WARNING,
                    fix="set [tls] cert and key, or bind 127.0.0.1 and reach it through an SSH "
                        "tunnel or a TLS reverse proxy (docs/remote.md)")


async def _start_mcp(stack: AsyncExitStack, config: Config, authenticator: Authenticator,
                     app_version: str, server: GatewayServer) -> McpHttpServer | None:
    """/mcp on [mcp] port, when set."""
    if not config.mcp.port:
        return None
    from gateway.mcp import start_http  # the optional `mcp` extra: imported only when on

    mcp = await start_http(config, authenticator, version=app_version, sockets=server.sockets,
                           daemon_url=client_url(server.scheme, config.server.host, server.port))
    stack.push_async_callback(mcp.close)  # stopped first: its tools are clients of the server
    return mcp


def _server(config: Config, core: RpcCore, authenticator: Authenticator, app_version: str,
            hub: Hub, unready: Callable[[], str | None]) -> GatewayServer:
    ssl_context = None
    if config.tls.cert and config.tls.key:
        ssl_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ssl_context.load_cert_chain(config.tls.cert, config.tls.key)
    return GatewayServer(core, authenticator, ServerSettings.from_config(config),
                         version=app_version, ssl_context=ssl_context, on_disconnect=hub.drop,
                         unready=unready)


async def _opened(stack: AsyncExitStack, opening: Awaitable[T],
                  close: Callable[[T], Awaitable[None]]) -> T:
    """What ``opening`` opens, with its ``close`` on ``stack``. Awaited through a shield: a
    cancelled start still learns what was opened (a thread cannot be stopped half-way) and
    closes it."""
    future = asyncio.ensure_future(opening)
    stack.push_async_callback(_close_opened, future, close)
    return await asyncio.shield(future)


async def _close_opened(future: asyncio.Future[T], close: Callable[[T], Awaitable[None]]) -> None:
    await _settle(future)
    if not future.cancelled() and future.exception() is None:
        await close(future.result())


async def _settle(future: asyncio.Future[Any]) -> None:
    """Wait for ``future`` to finish however it does (its failure is another's to report)."""
    await asyncio.gather(future, return_exceptions=True)


def _background(stack: AsyncExitStack, work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` as a task that the stack cancels and waits for."""
    stack.push_async_callback(_cancelled, asyncio.create_task(work))


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    await _settle(task)


async def _mark_clean_stop(audit: asyncio.Future[bool], data_dir: Path) -> None:
    """Leave the mode audit's clean-stop marker when this start's audit found nothing exposed."""
    await _settle(audit)
    if not audit.cancelled() and audit.exception() is None and audit.result():
        await asyncio.to_thread(mark_clean_stop, data_dir)


def _memory_admin(config: Config) -> str | None:
    # Without [[auth.users]] the one user owns everything; with them, only a named admin.
    if config.auth.users:
        return config.auth.admin
    return DEFAULT_USER


def _warn_if_exposed(data_dir: Path) -> bool:
    exposed = find_exposed(data_dir, take_clean_stop(data_dir))
    if exposed.count:
        log.warning("datadir.exposed", data_dir=str(data_dir), count=exposed.count,
                    paths=list(exposed.paths), fix=exposed.hint(data_dir),
                    detail="other local users can read or write these; transcripts and the "
                           "index hold private conversations")
    return not exposed.count


def _log_crash(exc: BaseException, error_id: str, method: str) -> None:
    log.error("rpc.crash", error_id=error_id, method=method, exc_info=exc)
