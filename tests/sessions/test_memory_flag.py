"""The incognito flag of a session: written in the transcript header, kept across an index
rebuild."""

from __future__ import annotations

from pathlib import Path

import orjson

from gateway.wire import session_wire
from sessions import SessionStore, memory_enabled, transcript_file
from sessions.layout import sessions_root


def test_memory_false_is_in_the_header_and_survives_a_rebuild(tmp_path: Path) -> None:
    """memory=False is written as "memory": false in line 1 and read back after the session
    index is deleted and rebuilt; an ordinary session's header has no such key."""
    store = SessionStore(tmp_path)
    secret = store.create("alice", title="secret", memory=False)
    plain = store.create("alice", title="plain")
    assert secret.memory is False and plain.memory is True
    store.close()
    root = sessions_root(tmp_path)
    secret_path = transcript_file(root, "alice", secret.session_key)
    plain_path = transcript_file(root, "alice", plain.session_key)
    assert orjson.loads(secret_path.read_bytes().splitlines()[0])["memory"] is False
    assert "memory" not in orjson.loads(plain_path.read_bytes().splitlines()[0])
    assert memory_enabled(secret_path) is False and memory_enabled(plain_path) is True
    for index_file in tmp_path.glob("sessions.db*"):
        index_file.unlink()
    reopened = SessionStore(tmp_path)
    try:
        assert reopened.get("alice", secret.session_key).memory is False
        assert session_wire(reopened.get("alice", plain.session_key)).get("memory") is None
    finally:
        reopened.close()


def test_purge_rewrites_atomically_and_a_failed_rewrite_changes_nothing(tmp_path: Path) -> None:
    """purge_messages drops only the messages in the window; when the rewrite's fsync fails the
    transcript is left byte for byte as it was and no temporary file remains."""
    from datetime import UTC, datetime, timedelta

    import pytest

    from sessions import FileIO, StorageError

    day = datetime(2026, 3, 1, tzinfo=UTC)
    store = SessionStore(tmp_path)
    key = store.create("alice").session_key
    for i in range(3):
        store.append_message("alice", key, role="user", content=f"message {i}",
                             ts=day + timedelta(days=i))
    path = transcript_file(sessions_root(tmp_path), "alice", key)
    store.close()

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    broken = SessionStore(tmp_path, file_io=FileIO(fsync=failing_fsync))
    before = path.read_bytes()
    with pytest.raises(StorageError):
        broken.purge_messages("alice", key, after=day + timedelta(hours=12))
    assert path.read_bytes() == before
    assert not list(path.parent.glob("*.purge"))
    broken.close()

    store = SessionStore(tmp_path)
    try:
        assert store.purge_messages("alice", key, after=day + timedelta(hours=12),
                                    before=day + timedelta(days=2)) == 1
        assert [m.content for m in store.history("alice", key)[0]] == ["message 0", "message 2"]
        assert store.get("alice", key).message_count == 2
    finally:
        store.close()


def test_an_incognito_session_stays_incognito_after_an_update_and_a_rebuild(tmp_path: Path) -> None:
    """A title or prompt update keeps memory=False: the index rebuilt from the transcript
    (header plus update line) still reports the session as incognito."""
    store = SessionStore(tmp_path)
    secret = store.create("alice", title="secret", memory=False)
    store.update("alice", secret.session_key, title="renamed", system_prompt="be brief")
    assert store.get("alice", secret.session_key).memory is False
    store.close()
    for index_file in tmp_path.glob("sessions.db*"):
        index_file.unlink()
    reopened = SessionStore(tmp_path)
    try:
        session = reopened.get("alice", secret.session_key)
        assert session.title == "renamed" and session.memory is False
    finally:
        reopened.close()
