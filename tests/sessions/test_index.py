"""The metadata index: rebuilt from transcripts when lost, corrupt or stale; fast to list."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import apsw
import orjson
import pytest

from sessions import Session, SessionsConfig, SessionStore
from sessions.index import SCHEMA_VERSION

from .conftest import LogList, fill

# Transcript files, their recovery and the index cache: the file store alone.
pytestmark = pytest.mark.jsonl_only


def _populate(data_dir: Path) -> list[Session]:
    """Three sessions with different message counts and dates; returns list() as stored."""
    with SessionStore(data_dir) as s:
        for i in range(3):
            key = s.create("alice", title=f"t{i}", model="m", system_prompt=f"p{i}",
                           created_at=f"2024-01-0{i + 1}T00:00:00Z").session_key
            for j in range(i + 1):
                s.append_message("alice", key, role="user", content=f"{i}-{j}",
                                 ts=f"2024-02-0{i + 1}T00:00:0{j}.5Z")
        s.create("bob", title="bob's")
        return s.list("alice")[0]


def _events(logs: LogList, name: str) -> LogList:
    return [e for e in logs if e["event"] == name]


def test_deleted_index_is_rebuilt_from_transcripts(
    data_dir: Path, logs: LogList
) -> None:
    """With sessions.db (and its WAL files) gone, a new store lists exactly the same sessions."""
    expected = _populate(data_dir)
    for name in ("sessions.db", "sessions.db-wal", "sessions.db-shm"):
        (data_dir / name).unlink(missing_ok=True)
    with SessionStore(data_dir) as s:
        assert s.list("alice")[0] == expected
        assert [x.title for x in s.list("bob")[0]] == ["bob's"]
    (event,) = _events(logs, "sessions.index_reconciled")[-1:]
    assert event["reason"] == "missing" and event["refreshed"] == 4


@pytest.mark.parametrize("damage", ["random_bytes", "truncated", "zeroed_page"])
def test_corrupt_index_is_replaced_and_rebuilt(
    data_dir: Path, logs: LogList, damage: str
) -> None:
    """A sessions.db that is not a database, or fails its integrity check, is discarded and
    rebuilt; listing is unchanged and the store works."""
    expected = _populate(data_dir)
    db = data_dir / "sessions.db"
    for name in ("sessions.db-wal", "sessions.db-shm"):
        (data_dir / name).unlink(missing_ok=True)
    if damage == "random_bytes":
        db.write_bytes(os.urandom(16384))
    elif damage == "truncated":
        db.write_bytes(db.read_bytes()[:1000])
    else:
        data = bytearray(db.read_bytes())
        data[4096:8192] = os.urandom(4096)
        db.write_bytes(bytes(data))
    with SessionStore(data_dir) as s:
        assert s.list("alice")[0] == expected
        s.create("alice")
        assert len(s.list("alice")[0]) == 4


def test_unknown_transcript_is_picked_up_at_open(data_dir: Path) -> None:
    """A transcript that appears on disk without an index row (copied in) is listed after open."""
    _populate(data_dir)
    elsewhere = data_dir.parent / "other"
    with SessionStore(elsewhere) as other:
        key = other.create("alice", title="copied", created_at="2030-01-01T00:00:00Z").session_key
        fill(other, "alice", key, 3)
        src = other.transcript_path("alice", key)
    shutil.copy(src, data_dir / "sessions" / "alice" / src.name)
    with SessionStore(data_dir) as s:
        first = s.list("alice", limit=1)[0][0]
        assert (first.session_key, first.title, first.message_count) == (key, "copied", 3)
        assert [m.content for m in s.history("alice", key)[0]] == ["m0", "m1", "m2"]


def test_vanished_transcript_row_is_dropped_at_open(data_dir: Path) -> None:
    """A row whose transcript was removed behind the store's back is gone after open."""
    expected = _populate(data_dir)
    victim = expected[0]
    (data_dir / "sessions" / "alice" / f"{victim.session_key}.jsonl").unlink()
    with SessionStore(data_dir) as s:
        assert [x.session_key for x in s.list("alice")[0]] == [x.session_key for x in expected[1:]]


def test_lines_appended_behind_the_index_are_counted(data_dir: Path) -> None:
    """A crash between the transcript write and the index update (simulated by appending a line
    directly) is noticed by size at open, and the row's count and updatedAt are re-derived."""
    with SessionStore(data_dir) as s:
        key = s.create("alice").session_key
        fill(s, "alice", key, 2)
        path = s.transcript_path("alice", key)
    line = {"type": "message", "id": "z" * 32, "role": "assistant", "content": "late",
            "ts": "2031-01-01T00:00:00.000Z", "runId": None}
    with path.open("ab") as f:
        f.write(orjson.dumps(line) + b"\n")
    with SessionStore(data_dir) as s:
        got = s.get("alice", key)
        assert got.message_count == 3 and got.updated_at == "2031-01-01T00:00:00.000Z"


def test_same_process_sees_a_changed_transcript_on_first_use(data_dir: Path) -> None:
    """A running store re-derives a session's row the first time it touches a transcript whose
    size differs from the index."""
    with SessionStore(data_dir) as writer:
        key = writer.create("alice").session_key
    store = SessionStore(data_dir)
    with SessionStore(data_dir) as writer:
        fill(writer, "alice", key, 4)
    assert store.get("alice", key).message_count == 4
    store.close()


def test_old_schema_version_is_rebuilt(data_dir: Path, logs: LogList) -> None:
    """An index written by another schema version is dropped and rebuilt rather than migrated."""
    expected = _populate(data_dir)
    conn = apsw.Connection(str(data_dir / "sessions.db"))
    conn.execute("UPDATE meta SET value = '0' WHERE key = 'schema_version'")
    conn.close()
    with SessionStore(data_dir) as s:
        assert s.list("alice")[0] == expected
    assert _events(logs, "sessions.index_reconciled")[-1]["reason"] == "schema"
    conn = apsw.Connection(str(data_dir / "sessions.db"))
    assert conn.execute("SELECT value FROM meta").fetchall() == [(SCHEMA_VERSION,)]
    conn.close()


def test_unchanged_index_is_not_rebuilt(data_dir: Path, logs: LogList) -> None:
    """Opening a store over an index that matches the disk refreshes nothing and logs nothing."""
    _populate(data_dir)
    seen = len(logs)
    with SessionStore(data_dir):
        pass
    assert _events(logs[seen:], "sessions.index_reconciled") == []


def test_stray_files_in_the_sessions_dir_are_ignored(data_dir: Path) -> None:
    """Files and directories that are not <valid user>/<valid key>.jsonl never enter the index."""
    expected = _populate(data_dir)
    root = data_dir / "sessions"
    (root / "alice" / "notes.txt").write_text("hi")
    (root / "alice" / "NOTAKEY.jsonl").write_text("{}\n")
    (root / "..hidden").mkdir()
    (root / "stray.jsonl").write_text("{}\n")
    with SessionStore(data_dir) as s:
        assert s.list("alice")[0] == expected


def test_listing_newest_page_of_10000_sessions(tmp_path: Path) -> None:
    """With 10,000 sessions the newest page is the right 50 (time printed, not asserted)."""
    data_dir = tmp_path / "data"
    store = SessionStore(data_dir, SessionsConfig(fsync="never"))
    started = time.perf_counter()
    keys = [
        store.create("alice", created_at="2024-01-01T00:00:00.000Z").session_key
        for _ in range(10_000)
    ]
    created_s = time.perf_counter() - started
    started = time.perf_counter()
    page, cursor = store.list("alice", limit=50)
    first_ms = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    for _ in range(100):
        store.list("alice", limit=50, before=cursor)
    next_ms = (time.perf_counter() - started) * 10
    assert [s.session_key for s in page] == sorted(keys, reverse=True)[:50]
    assert cursor is not None
    store.close()
    started = time.perf_counter()
    (data_dir / "sessions.db").unlink()
    rebuilt = SessionStore(data_dir, SessionsConfig(fsync="never"))
    rebuild_s = time.perf_counter() - started
    assert [s.session_key for s in rebuilt.list("alice", limit=50)[0]] == [
        s.session_key for s in page
    ]
    rebuilt.close()
    print(
        f"\n10k sessions: create {created_s:.2f}s, newest page {first_ms:.2f} ms, "
        f"next page {next_ms:.3f} ms avg, rebuild {rebuild_s:.2f}s"
    )
