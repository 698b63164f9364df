"""A PostgreSQL outage as clients see it: reported by gateway.health and GET /readyz, every call
answered with the storage error (retryable, no errorId, the reason said once) rather than an
internal error, and calls served again once the database is back, with nothing acknowledged
lost. The test stops and starts a PostgreSQL of its own: the session's is shared."""

from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg_pool import PoolTimeout

from gateway.app import App, start_app
from gateway.client import Client, RpcError
from gateway.config import Config
from gateway.errors import to_error_object
from memory import MemoryStorageError
from sessions import StorageError
from testkit.gateway import http_get
from testkit.postgres import PostgresServer, PostgresUnavailable, start_postgres
from tests.conftest import TOKEN
from tests.fake_openai import FakeOpenAI


class Outage:
    """A throwaway PostgreSQL that the test may stop and start again on the same port and data."""

    def __init__(self, server: PostgresServer) -> None:
        self.server = server
        self._opts: list[str] = []

    def stop(self) -> None:
        # The command line the server was started with, to start it again as it was.
        argv = shlex.split((self.server.datadir / "postmaster.opts").read_text())
        self._opts = [a for i, a in enumerate(argv[1:], 1) if a != "-D" and argv[i - 1] != "-D"]
        self.server._run("pg_ctl", "stop", "-D", str(self.server.datadir), "-m", "fast", "-w")

    def start(self) -> None:
        self.server._run("pg_ctl", "start", "-D", str(self.server.datadir), "-w", "-t", "60",
                         "-l", str(self.server.datadir / "server.log"), "-o",
                         shlex.join(self._opts))


@pytest.fixture
def own_postgres() -> Iterator[Outage]:
    try:
        server = start_postgres()
    except PostgresUnavailable as exc:
        pytest.skip(f"no PostgreSQL for this run: {exc}")
    try:
        yield Outage(server)
    finally:
        server.stop()


@pytest.fixture
async def pg_app(own_postgres: Outage, config_factory: Callable[..., Config],
                 fake_openai: FakeOpenAI) -> AsyncIterator[App]:
    dsn = own_postgres.server.create_database("outage")
    config = config_factory(
        storage={"backend": "postgres", "dsn": dsn, "call_timeout_s": 2, "check_interval_s": 0.5},
        memory={"enabled": True, "embedder": "none"},
        llm={"base_url": fake_openai.base_url, "api_key": "sk-test", "model": "fake-model",
             "max_retries": 0})
    app = await start_app(config)
    try:
        yield app
    finally:
        await app.close()


def http_status(port: int, path: str) -> int:
    return http_get(port, path)[0]


async def eventually(check: Callable[[], Awaitable[Any]], timeout: float = 30) -> Any:
    async with asyncio.timeout(timeout):
        while not (result := await check()):
            await asyncio.sleep(0.2)
        return result


def assert_storage_error(err: RpcError) -> None:
    assert err.code == -32603, err
    assert err.message.startswith("storage error: "), err
    assert "storage error: storage error" not in err.message, err
    assert err.data["retryable"] is True, err
    assert "errorId" not in err.data, err
    assert err.data["retryAfterMs"] > 0, err


async def send(c: Client, key: str, message: str, idem: str | None = None) -> dict[str, Any]:
    params = {"sessionKey": key, "message": message, **({"idempotencyKey": idem} if idem else {})}
    reply: dict[str, Any] = await c.call("chat.send", params)
    return reply


@pytest.mark.slow
async def test_a_database_outage_is_reported_answered_as_storage_errors_and_recovered(
        pg_app: App, own_postgres: Outage) -> None:
    """With the database stopped, health is degraded, /readyz 503 (/healthz 200), and chat.send
    (with and without a key), sessions.history and memory.status answer the storage error; once
    it is back, sends succeed again and every acknowledged message is in the history."""
    port = pg_app.server.port
    acknowledged: list[str] = []
    async with Client.connect(pg_app.url, TOKEN) as c:
        key = (await c.call("sessions.create", {}))["sessionKey"]
        run = await send(c, key, "before")
        acknowledged.append("before")
        await c.next_event("chat.final", timeout=30)
        assert (await c.call("gateway.health"))["storage"]["status"] == "ok"
        assert await asyncio.to_thread(http_status, port, "/readyz") == 200

        await asyncio.to_thread(own_postgres.stop)
        down = await eventually(lambda: _degraded(c))
        assert down["status"] == "degraded" and down["storage"]["reason"], down
        assert await asyncio.to_thread(http_status, port, "/readyz") == 503
        assert await asyncio.to_thread(http_status, port, "/healthz") == 200

        calls: list[Callable[[], Awaitable[Any]]] = [
            lambda: send(c, key, "while down"),
            lambda: send(c, key, "while down, keyed", idem="k-down"),
            lambda: c.call("sessions.history", {"sessionKey": key}),
            lambda: c.call("memory.status", {}),
        ]
        for call in calls:
            started = time.monotonic()
            try:
                async with asyncio.timeout(30):  # generous: the goal is a few seconds
                    await call()
            except RpcError as err:
                assert_storage_error(err)
            else:
                pytest.fail("a call succeeded with the database stopped")
            assert time.monotonic() - started < 30

        await asyncio.to_thread(own_postgres.start)

        async def sent_again() -> dict[str, Any] | None:
            try:
                return await send(c, key, "after", idem="k-after")
            except RpcError as err:
                assert_storage_error(err)  # still the storage error until the pools reconnect
                return None

        run = await eventually(sent_again)
        acknowledged.append("after")
        final = await c.next_event("chat.final", timeout=30)
        assert final["params"]["runId"] == run["runId"]
        await eventually(lambda: _healthy(c))
        assert await asyncio.to_thread(http_status, port, "/readyz") == 200
        history = (await c.call("sessions.history", {"sessionKey": key, "limit": 50}))["messages"]
        users = [m["content"] for m in history if m["role"] == "user"]
        assert [u for u in users if u in acknowledged] == acknowledged
        assert len([m for m in history if m["role"] == "assistant"]) >= len(acknowledged)


async def _degraded(c: Client) -> dict[str, Any] | None:
    health: dict[str, Any] = await c.call("gateway.health")
    return health if health["storage"]["status"] == "degraded" else None


async def _healthy(c: Client) -> bool:
    return bool((await c.call("gateway.health"))["status"] == "ok")


def _operational(message: str) -> psycopg.OperationalError:
    return psycopg.OperationalError(message)


@pytest.mark.parametrize("exc", [
    PoolTimeout("couldn't get a connection after 5.00 sec"),
    _operational('connection failed: connection to server at "db.internal", port 5432 failed: '
                 "Connection refused"),
])
def test_a_bare_database_failure_is_the_storage_error_with_a_retry_hint(exc: Exception) -> None:
    """A psycopg operational error reaching the gateway bare (a pool timeout, a refused
    connection) is the retryable storage error with retryAfterMs, naming no host."""
    obj: Any = to_error_object(exc)
    assert obj["code"] == -32603 and obj["message"].startswith("storage error: ")
    assert obj["data"]["retryable"] is True and obj["data"]["retryAfterMs"] > 0
    assert "errorId" not in obj["data"] and "db.internal" not in obj["message"]


def test_a_wrapped_database_failure_says_storage_error_once_with_the_reason() -> None:
    """memory's and sessions' errors caused by PostgreSQL keep one "storage error: " prefix,
    say what failed instead of only the driver's class, and carry retryAfterMs."""
    cause = PoolTimeout("couldn't get a connection after 5.00 sec")
    try:
        raise MemoryStorageError("storage error: PoolTimeout") from cause
    except MemoryStorageError as exc:
        memory: Any = to_error_object(exc)
    assert memory["message"] == "storage error: couldn't get a connection after 5.00 sec"
    assert memory["data"]["retryAfterMs"] > 0
    try:
        raise StorageError("session database unavailable while reading messages") from cause
    except StorageError as exc:
        sessions: Any = to_error_object(exc)
    assert sessions["message"] == ("storage error: session database unavailable while reading "
                                   "messages: couldn't get a connection after 5.00 sec")
    assert sessions["data"] == {"retryable": True, "retryAfterMs": sessions["data"]["retryAfterMs"]}


def test_memory_start_errors_name_the_reason(tmp_path: Path) -> None:
    """PgMemory.open against a server that refuses says why (libpq's words), not only a class."""
    from memory import MemoryConfig, PgMemory
    from tests.faults.helpers import free_port

    dsn = f"postgresql://nobody@127.0.0.1:{free_port()}/recalld"
    with pytest.raises(MemoryStorageError) as caught:
        asyncio.run(PgMemory.open(dsn, MemoryConfig(), None, data_dir=tmp_path,
                                  connect_timeout_s=2))
    assert "Connection refused" in str(caught.value) or "connection failed" in str(caught.value)
    assert not str(caught.value).startswith("storage error")


@pytest.mark.slow
async def test_a_table_lock_held_answers_the_storage_error_after_lock_timeout(
        config_factory: Callable[..., Config], fake_openai: FakeOpenAI, pg_dsn: str) -> None:
    """A table locked by someone else makes a call answer the storage error naming the lock
    timeout (storage.lock_timeout_s), not wait for as long as the lock is held."""
    config = config_factory(storage={"backend": "postgres", "dsn": pg_dsn, "lock_timeout_s": 1},
                            memory={"enabled": False},
                            llm={"base_url": fake_openai.base_url, "api_key": "sk-test",
                                 "model": "fake-model"})
    app = await start_app(config)
    try:
        async with Client.connect(app.url, TOKEN) as c, \
                await psycopg.AsyncConnection.connect(pg_dsn) as locker:
            await c.call("sessions.create", {})
            await locker.execute("LOCK TABLE recalld_sessions IN ACCESS EXCLUSIVE MODE")
            started = time.monotonic()
            with pytest.raises(RpcError) as caught:
                async with asyncio.timeout(30):  # the lock is held until the block ends
                    await c.call("sessions.list", {})
            assert time.monotonic() - started < 30
            assert_storage_error(caught.value)
            assert "lock timeout" in caught.value.message
            await locker.rollback()
            assert (await c.call("sessions.list", {}))["sessions"]
    finally:
        await app.close()


async def test_a_sqlite_node_is_ready_and_its_storage_ok(app: App) -> None:
    """With SQLite, GET /readyz answers 200 and gateway.health reports storage ok."""
    assert await asyncio.to_thread(http_status, app.server.port, "/readyz") == 200
    async with Client.connect(app.url, TOKEN) as c:
        health = await c.call("gateway.health")
    assert health["status"] == "ok"
    assert health["storage"] == {"backend": "sqlite", "status": "ok", "reason": None,
                                 "sinceS": health["storage"]["sinceS"]}
