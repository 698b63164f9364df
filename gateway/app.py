"""Wiring: build every part from one :class:`Config`, start them, and stop them in order.

Shutdown order (STYLE 3): stop accepting → close connections 1001 → let runs finish within
``server.shutdown_grace_s`` → cancel the rest → flush transcripts → close the index.
``App.close()`` is safe to call twice.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Protocol

import structlog

from gateway.auth import Authenticator, load_or_create_token, token_path
from gateway.chat import attach_chat
from gateway.config import Config
from gateway.hub import Hub
from gateway.memory_methods import attach_memory
from gateway.methods import register_core_methods
from gateway.registry import Registry
from gateway.rpc import RpcCore
from gateway.schemas import declare_all
from gateway.server import GatewayServer
from sessions import FileIO, SessionStore

__all__ = ["App", "start_app"]

log = structlog.get_logger("recalld.app")


def package_version() -> str:
    try:
        return version("recalld")
    except PackageNotFoundError:
        return "0.0.0"


class ChatService(Protocol):
    async def abort_session(self, user: str, session_key: str) -> None: ...
    async def drain(self, grace_s: float) -> None: ...


class MemoryFacade(Protocol):
    async def health(self) -> dict[str, Any]: ...
    async def recall(self, user: str, session_key: str, query: str, k: int) -> list[dict[str, Any]]: ...
    def nudge(self) -> None: ...
    async def delete_session(self, user: str, session_key: str) -> None: ...
    async def close(self) -> None: ...


@dataclass
class App:
    config: Config
    registry: Registry
    store: SessionStore
    hub: Hub
    authenticator: Authenticator
    version: str
    server: GatewayServer = field(init=False)
    chat: ChatService | None = None
    memory: MemoryFacade | None = None
    lock_fd: int | None = None
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
        if self.chat is not None:
            await self.chat.drain(self.config.server.shutdown_grace_s)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.to_thread(self.store.close)
        if self.memory is not None:
            await self.memory.close()
        if self.lock_fd is not None:
            os.close(self.lock_fd)  # releases the data dir lock
            self.lock_fd = None
        log.info("app.closed")

    async def _flush_loop(self) -> None:
        # fsync="batch": transcripts reach the disk at least once a second.
        interval = self.config.sessions.fsync_interval_s
        while True:
            await asyncio.sleep(interval)
            try:
                await asyncio.to_thread(self.store.flush)
            except OSError as exc:
                log.warning("sessions.flush_failed", error=str(exc))


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


async def start_app(config: Config, *, file_io: FileIO | None = None) -> App:
    """Build and start everything; the returned app is listening on ``app.url``.

    ``file_io`` replaces the transcript write/fsync calls (fault-injection tests).
    """
    config.data_dir.mkdir(parents=True, exist_ok=True)
    lock_fd = _lock_data_dir(config.data_dir)
    generated = None
    if config.auth.mode == "token" and not config.auth.token and not config.auth.users:
        generated, created = load_or_create_token(config.data_dir)
        if created:
            log.warning("auth.token_generated", path=str(token_path(config.data_dir)))
        else:
            log.info("auth.token_file", path=str(token_path(config.data_dir)))
    authenticator = Authenticator(config.auth, generated)
    registry = Registry()
    declare_all(registry)
    try:
        store = SessionStore(config.data_dir, config.sessions, file_io=file_io)
    except BaseException:
        os.close(lock_fd)
        raise
    app = App(config, registry, store, Hub(), authenticator, package_version(), lock_fd=lock_fd)
    core = RpcCore(registry, max_batch=config.limits.max_batch, on_crash=_log_crash)
    app.server = GatewayServer(config, core, authenticator, app.hub, version=app.version)
    register_core_methods(app)
    attach_chat(app)
    if config.sessions.fsync == "batch":
        app._tasks.append(asyncio.create_task(app._flush_loop()))
    try:
        await attach_memory(app)
        await app.server.start()
    except BaseException:
        await app.close()
        raise
    return app


def _log_crash(exc: BaseException, error_id: str, method: str) -> None:
    log.error("rpc.crash", error_id=error_id, method=method, exc_info=exc)
