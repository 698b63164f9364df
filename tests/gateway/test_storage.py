"""The ``[storage]`` backend choice: each mistake refused at load naming the setting, and the
configured store opened for real (an unreachable server refused at once, naming storage.dsn)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gateway.config import ConfigError, load
from gateway.storage import StorageUnavailable, open_session_store
from sessions import SessionsConfig, SessionStore


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_sqlite_is_the_default_and_opens_the_file_store(tmp_path: Path) -> None:
    """With nothing set the backend is sqlite, and the factory opens the JSONL/SQLite store."""
    cfg = load(None, env={}, data_dir=tmp_path)
    assert (cfg.storage.backend, cfg.storage.dsn) == ("sqlite", None)
    store = open_session_store(cfg.storage, cfg.data_dir, cfg.sessions)
    try:
        assert isinstance(store, SessionStore)
        assert (tmp_path / "sessions").is_dir()
    finally:
        store.close()


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"RECALLD_STORAGE_BACKEND": "mysql"},
         "RECALLD_STORAGE_BACKEND: must be one of sqlite, postgres"),
        ({"RECALLD_STORAGE_BACKEND": "postgres"}, 'storage.backend = "postgres" needs storage.dsn'),
        ({"RECALLD_STORAGE_BACKEND": "postgres", "RECALLD_STORAGE_DSN": ""}, "needs storage.dsn"),
        ({"RECALLD_STORAGE_BACKEND": "postgres", "RECALLD_STORAGE_DSN": "mysql://pw-secret@x"},
         "storage.dsn (RECALLD_STORAGE_DSN) is not a PostgreSQL connection string"),
        ({"RECALLD_STORAGE_BACKEND": "postgres",
          "RECALLD_STORAGE_DSN": "host=db port=fifty password=pw-secret"},
         "storage.dsn (RECALLD_STORAGE_DSN) has a port that is not a number"),
        ({"RECALLD_STORAGE_POOL_SIZE": "0"}, "RECALLD_STORAGE_POOL_SIZE: must be >= 1"),
    ],
)
def test_each_storage_mistake_is_one_clear_line(tmp_path: Path, env: dict[str, str],
                                                needle: str) -> None:
    """An unknown backend, postgres without a DSN, a malformed DSN or a bad number is a
    ConfigError naming the setting, and the DSN (which may hold a password) is never echoed."""
    with pytest.raises(ConfigError) as info:
        load(None, env=env, data_dir=tmp_path)
    assert any(needle in line for line in info.value.problems), info.value.problems
    assert "pw-secret" not in str(info.value)


def test_the_file_sets_the_backend_and_the_environment_wins(tmp_path: Path) -> None:
    """[storage] in config.toml is read, and RECALLD_STORAGE_DSN overrides its dsn."""
    path = tmp_path / "config.toml"
    path.write_text('[storage]\nbackend = "postgres"\ndsn = "postgresql://a@h1/db"\n')
    assert load(path, env={}).storage.dsn == "postgresql://a@h1/db"
    cfg = load(path, env={"RECALLD_STORAGE_DSN": "host=h2 dbname=db"})
    assert (cfg.storage.backend, cfg.storage.dsn) == ("postgres", "host=h2 dbname=db")


def test_an_unreachable_server_fails_at_once_naming_the_dsn(tmp_path: Path) -> None:
    """A DSN pointing at a closed port is StorageUnavailable naming storage.dsn with the
    server's reason, never a fallback to SQLite (no data dir files are made)."""
    env = {"RECALLD_STORAGE_BACKEND": "postgres",
           "RECALLD_STORAGE_DSN": f"postgresql://u:pw-secret@127.0.0.1:{_closed_port()}/recalld",
           "RECALLD_STORAGE_CONNECT_TIMEOUT_S": "2"}
    cfg = load(None, env=env, data_dir=tmp_path)
    with pytest.raises(StorageUnavailable) as info:
        open_session_store(cfg.storage, cfg.data_dir, cfg.sessions)
    message = str(info.value)
    assert message.startswith(
        "storage.dsn (RECALLD_STORAGE_DSN): could not open the session database")
    assert "pw-secret" not in message
    assert not (tmp_path / "sessions").exists()


def test_postgres_opens_the_database_store(tmp_path: Path, pg_dsn: str) -> None:
    """backend = postgres with a reachable DSN gives a store on that database."""
    from sessions import PgSessionStore

    cfg = load(None, env={"RECALLD_STORAGE_BACKEND": "postgres", "RECALLD_STORAGE_DSN": pg_dsn},
               data_dir=tmp_path)
    store = open_session_store(cfg.storage, cfg.data_dir, SessionsConfig())
    try:
        assert isinstance(store, PgSessionStore)
        key = store.create("alice").session_key
        assert store.get("alice", key).message_count == 0
    finally:
        store.close()
    assert not (tmp_path / "sessions").exists()
