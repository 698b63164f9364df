"""`recalld import` into PostgreSQL: a file into the configured backend, and `--from` moving a
single-node data dir in, idempotently and resumably, with nothing of a session lost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli.importer import import_conversations
from gateway.cli.importer_formats import parse
from gateway.cli.importer_move import move_data_dir
from gateway.cli.main import main
from gateway.storage import StorageConfig
from sessions import PgSessionStore, SessionsConfig, SessionStore

from .test_cli_import import chatgpt_export


def _source(data_dir: Path) -> dict[str, str]:
    """A single-node data dir: two users, an update, an incognito session, names and extras."""
    with SessionStore(data_dir) as store:
        a = store.create("alice", title="Trip", system_prompt="Be brief.", model="m1",
                         created_at="2024-01-01T00:00:00Z")
        store.append_message("alice", a.session_key, role="user", content="where to?",
                             ts="2024-01-01T00:00:01Z")
        store.append_message("alice", a.session_key, role="assistant", content="Lisbon",
                             run_id="r1", name="Ada", ts="2024-01-01T00:00:02Z",
                             extra={"model": "m1", "usage": {"totalTokens": 7}})
        store.update("alice", a.session_key, title="Lisbon trip")
        secret = store.create("alice", title="secret", memory=False)
        store.append_message("alice", secret.session_key, role="user", content="shh")
        b = store.create("bob")
        return {"trip": a.session_key, "secret": secret.session_key, "bob": b.session_key}


def _snapshot(store: PgSessionStore | SessionStore, user: str) -> list[tuple[object, ...]]:
    sessions, _ = store.list(user)
    out: list[tuple[object, ...]] = []
    for s in sessions:
        full = store.get(user, s.session_key)
        messages = store.recent_messages(user, s.session_key, 1000)
        out.append((full.session_key, full.title, full.system_prompt, full.model, full.memory,
                    full.created_at, full.updated_at, full.message_count,
                    [(m.role, m.content, m.ts, m.run_id, m.name, m.extra) for m in messages]))
    return out


def test_moving_a_data_dir_keeps_every_session_and_a_rerun_adds_nothing(tmp_path: Path,
                                                                        pg_dsn: str) -> None:
    """Every session arrives with its key, metadata and messages; a second run writes nothing;
    messages added to the source since are appended by a third."""
    source = tmp_path / "single"
    keys = _source(source)
    storage = StorageConfig(backend="postgres", dsn=pg_dsn)
    first = move_data_dir(source, storage, tmp_path / "node", SessionsConfig())
    assert (first.sessions, first.created, first.messages, first.unreadable) == (3, 3, 3, 0)
    with SessionStore(source) as src, PgSessionStore(pg_dsn) as dst:
        for user in ("alice", "bob"):
            assert _snapshot(dst, user) == _snapshot(src, user)
        assert dst.get("alice", keys["secret"]).memory is False
        assert dst.get("alice", keys["trip"]).title == "Lisbon trip"
    again = move_data_dir(source, storage, tmp_path / "node", SessionsConfig())
    assert (again.created, again.resumed, again.unchanged, again.messages) == (0, 0, 3, 0)
    with SessionStore(source) as src:
        src.append_message("alice", keys["trip"], role="user", content="and after?")
    resumed = move_data_dir(source, storage, tmp_path / "node", SessionsConfig())
    assert (resumed.resumed, resumed.messages) == (1, 1)
    with SessionStore(source) as src, PgSessionStore(pg_dsn) as dst:
        assert _snapshot(dst, "alice") == _snapshot(src, "alice")
    assert not (tmp_path / "node" / "sessions").exists()


def test_importing_a_file_into_postgres_twice_adds_nothing(tmp_path: Path, pg_dsn: str) -> None:
    """A ChatGPT export lands in the database, and importing it again writes nothing."""
    conversations = parse(json.dumps(chatgpt_export()).encode(), "chatgpt")
    storage = StorageConfig(backend="postgres", dsn=pg_dsn)
    first = import_conversations(tmp_path, SessionsConfig(), "default", "chatgpt", conversations,
                                 storage=storage)
    second = import_conversations(tmp_path, SessionsConfig(), "default", "chatgpt", conversations,
                                  storage=storage)
    assert first.created == 2 and first.messages > 0
    assert (second.created, second.unchanged, second.messages) == (0, 2, 0)
    with PgSessionStore(pg_dsn) as store:
        titles = sorted(s.title for s in store.list("default")[0])
    assert titles == ["Bike", "Sourdough"]
    assert not (tmp_path / "sessions").exists()


def test_the_command_moves_a_data_dir(tmp_path: Path, pg_dsn: str, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """`recalld import --from DIR` with the postgres backend configured moves it and says so;
    FILE and --from together are refused."""
    source = tmp_path / "single"
    _source(source)
    monkeypatch.setenv("RECALLD_STORAGE_BACKEND", "postgres")
    monkeypatch.setenv("RECALLD_STORAGE_DSN", pg_dsn)
    assert main(["import", "--from", str(source), "--data-dir", str(tmp_path / "node")]) == 0
    assert "moved 3 sessions" in capsys.readouterr().out
    assert main(["import", str(tmp_path / "x.json"), "--from", str(source),
                 "--data-dir", str(tmp_path / "node")]) == 2
    assert "one of them" in capsys.readouterr().err
