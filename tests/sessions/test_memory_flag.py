"""The incognito flag of a session: written in the transcript header, kept across an index rebuild."""

from __future__ import annotations

from pathlib import Path

import orjson

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
        assert reopened.get("alice", plain.session_key).to_wire().get("memory") is None
    finally:
        reopened.close()
