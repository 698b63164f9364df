"""The gateway on ``storage.backend = "postgres"``: memory is PgMemory on storage.dsn, nothing of
it in the data dir, and ``recalld memory status|index|search`` work on the shared index."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.app import start_app
from gateway.client import Client
from gateway.config import Config
from gateway.storage import StorageUnavailable
from memory import PgMemory
from sessions import PgSessionStore
from tests.conftest import TOKEN, running
from tests.fake_openai import FakeOpenAI
from tests.gateway.test_memory_methods import chat_config, say, search_until


async def test_memory_lives_in_postgres_not_in_the_data_dir(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI, pg_dsn: str
) -> None:
    """A chat on postgres is indexed by the node's PgMemory: found by memory.search, counted by
    memory.status (pgvector, no file), with no memory.db and no transcripts in the data dir."""
    cfg = chat_config(
        lambda **s: config_factory(storage={"backend": "postgres", "dsn": pg_dsn}, **s),
        fake_openai)
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        assert app.memory is not None and isinstance(app.memory.service, PgMemory)
        key = (await c.call("sessions.create"))["sessionKey"]
        await say(c, key, "The lighthouse keeper's name is Ada.")
        found = await search_until(c, {"query": "lighthouse keeper"})
        assert found["results"][0]["sessionKey"] == key
        status = await c.call("memory.status")
        assert status["files"] == 1 and status["chunks"] >= 1 and "dbPath" not in status
        assert status["vectorBackend"]["reason"].startswith("pgvector")
    assert not (cfg.data_dir / "memory.db").exists() and not (cfg.data_dir / "sessions").exists()


def recalld(data_dir: Path, dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECALLD_", "OPENAI_"))}
    env.update(RECALLD_MEMORY_EMBEDDER="none", RECALLD_STORAGE_BACKEND="postgres",
               RECALLD_STORAGE_DSN=dsn)
    return subprocess.run([sys.executable, "-m", "gateway", "--data-dir", str(data_dir),
                           "memory", *args],
                          capture_output=True, text=True, timeout=120, env=env,
                          stdin=subprocess.DEVNULL)


def test_cli_indexes_and_searches_the_shared_index(tmp_path: Path, pg_dsn: str) -> None:
    """`memory index` runs a pass over the sessions in PostgreSQL, `search` finds them and
    `status` names PostgreSQL and pgvector instead of a file."""
    with PgSessionStore(pg_dsn, pool_size=1) as store:
        key = store.create("default", title="langs").session_key
        store.append_message("default", key, role="user",
                             content="My favourite programming language is Rust.")
    out = recalld(tmp_path, pg_dsn, "index")
    assert out.returncode == 0, out.stderr
    assert "1 changed" in out.stdout
    found = recalld(tmp_path, pg_dsn, "search", "favourite programming language", "--json")
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["results"][0]["sessionKey"] == key
    status = recalld(tmp_path, pg_dsn, "status")
    assert status.returncode == 0, status.stderr
    assert "PostgreSQL (storage.dsn)" in status.stdout and "pgvector" in status.stdout
    assert not (tmp_path / "memory.db").exists()


async def test_an_unreachable_server_is_a_start_error_naming_the_setting(
    config_factory: Callable[..., Config],
) -> None:
    """A server that refuses the connection stops the start with StorageUnavailable naming
    storage.dsn; nothing falls back to SQLite and the DSN is not repeated."""
    dsn = "postgresql://recalld:secret-password@127.0.0.1:1/recalld"
    cfg = config_factory(storage={"backend": "postgres", "dsn": dsn, "connect_timeout_s": 1})
    with pytest.raises(StorageUnavailable) as info:
        await start_app(cfg)
    assert "storage.dsn" in str(info.value) and "secret-password" not in str(info.value)
    assert not (cfg.data_dir / "memory.db").exists()


@pytest.mark.parametrize("ledger", ["recalld_sessions_migrations", "recalld_memory_migrations",
                                    "recalld_cluster_migrations"])
async def test_a_database_a_newer_version_migrated_stops_the_start_naming_it(
    config_factory: Callable[..., Config], pg_dsn: str, ledger: str
) -> None:
    """A node whose database records a migration newer than this version's (another node was
    upgraded first) does not start on it: the start error names the migration and says to
    upgrade, and nothing is migrated further."""
    cfg = config_factory(storage={"backend": "postgres", "dsn": pg_dsn})
    async with running(cfg):
        pass
    import psycopg

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {ledger} (name, applied_at) VALUES ('m099_newer', now())")
    with pytest.raises(StorageUnavailable) as info:
        await start_app(cfg)
    assert f"migrated by a newer recalld (m099_newer in {ledger})" in str(info.value)
    assert "upgrade this node" in str(info.value)
