"""What only the PostgreSQL store has: its tables and migrations, the per-session sequence,
the notify after an append, text PostgreSQL cannot hold, and an unreachable server."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from sessions import InvalidSessionInput, SessionsConfig, StorageError
from sessions.pg import MIGRATIONS, NOTIFY_CHANNEL, PgSessionStore

from .conftest import fill


@pytest.fixture
def pg_store(pg_dsn: str) -> Iterator[PgSessionStore]:
    with PgSessionStore(pg_dsn, SessionsConfig(), pool_size=4) as store:
        yield store


def _applied(dsn: str) -> list[tuple[str, int]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT name, count(*) FROM recalld_sessions_migrations GROUP BY name ORDER BY name"
        ).fetchall()
    return [(str(name), int(n)) for name, n in rows]


def test_nodes_migrating_one_empty_database_at_once_all_succeed(pg_dsn: str) -> None:
    """Eight threads and four processes open a store on one empty database at the same moment:
    every one starts, and each migration is recorded exactly once."""
    start = threading.Barrier(8)

    def open_one(_: int) -> None:
        start.wait()
        PgSessionStore(pg_dsn, pool_size=1).close()

    script = ("import sys; from sessions.pg import PgSessionStore; "
              "PgSessionStore(sys.argv[1], pool_size=1).close()")
    procs = [subprocess.Popen([sys.executable, "-c", script, pg_dsn], env=os.environ.copy())
             for _ in range(4)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(open_one, range(8)))
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    assert _applied(pg_dsn) == [(name, 1) for name, _ in MIGRATIONS]


def test_messages_get_the_next_seq_of_their_session(pg_store: PgSessionStore, pg_dsn: str) -> None:
    """Each session numbers its messages 0, 1, 2… in append order, whatever other sessions do,
    and bytes is the sum of their transcript lines."""
    a, b = pg_store.create("alice"), pg_store.create("alice")
    for i in range(3):
        pg_store.append_message("alice", a.session_key, role="user", content=f"a{i}")
        pg_store.append_message("alice", b.session_key, role="user", content=f"b{i}")
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(
            "SELECT seq, content FROM recalld_messages WHERE session_key = %s ORDER BY seq",
            (a.session_key,)).fetchall()
        count, total, lines = conn.execute(
            "SELECT s.message_count, s.bytes, (SELECT sum(line_bytes) FROM recalld_messages m"
            " WHERE m.session_key = s.session_key) FROM recalld_sessions s WHERE session_key = %s",
            (a.session_key,)).fetchone() or (None, None, None)
    assert rows == [(0, "a0"), (1, "a1"), (2, "a2")]
    assert count == 3 and total == lines and total > 0


def test_an_append_notifies_its_session_key_once_committed(
    pg_store: PgSessionStore, pg_dsn: str
) -> None:
    """A listener on recalld_messages gets the session key of each committed append."""
    s = pg_store.create("alice")
    with psycopg.connect(pg_dsn, autocommit=True) as listener:
        listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        fill(pg_store, "alice", s.session_key, 2)
        got = [n.payload for n in listener.notifies(timeout=10, stop_after=2)]
    assert got == [s.session_key, s.session_key]


def test_text_postgresql_cannot_hold_is_refused_by_field(pg_store: PgSessionStore) -> None:
    """A NUL character (fine in a JSONL line, impossible in PostgreSQL text) is refused as bad
    input naming its field, and nothing is stored."""
    s = pg_store.create("alice")
    for kwargs, field in (({"content": "a\x00b"}, "content"), ({"name": "\x00"}, "name"),
                          ({"extra": {"k": ["\x00"]}}, "extra")):
        with pytest.raises(InvalidSessionInput) as info:
            pg_store.append_message("alice", s.session_key, role="user",
                                    **{"content": "ok", **kwargs})  # type: ignore[arg-type]
        assert info.value.field == field
    with pytest.raises(InvalidSessionInput) as info:
        pg_store.create("alice", title="t\x00")
    assert info.value.field == "title"
    assert pg_store.get("alice", s.session_key).message_count == 0
    assert len(pg_store.list("alice")[0]) == 1


def test_there_is_no_transcript_file(pg_store: PgSessionStore) -> None:
    """transcript_path answers StorageError for a real session (there is no file), and
    flush() has nothing to do."""
    s = pg_store.create("alice")
    with pytest.raises(StorageError, match="no transcript file"):
        pg_store.transcript_path("alice", s.session_key)
    pg_store.flush()


def test_an_unreachable_server_is_a_storage_error_saying_why() -> None:
    """A DSN pointing at a closed port fails at once with the server's reason and no password."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(StorageError) as info:
        PgSessionStore(f"postgresql://u:secret-pw@127.0.0.1:{port}/db", connect_timeout_s=2)
    assert "could not open the session database" in str(info.value)
    assert "secret-pw" not in str(info.value)
