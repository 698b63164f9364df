"""Conversation summaries: a line (a row on PostgreSQL) of its own, the newest superseding the
earlier, never a message, gone with the session and with a purge of a message it covers."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sessions import (
    SUMMARY_TYPE,
    ConversationSummary,
    ForwardReader,
    InvalidSessionInput,
    Message,
    SessionNotFound,
    SessionsConfig,
    SessionStore,
    visible_history,
)
from tests.sessions.conftest import fill, read_lines


def test_summary_supersedes_and_is_no_message(store: SessionStore) -> None:
    """The newest summary is the one read back; neither the count, the history nor updatedAt
    sees a summary."""
    key = store.create("alice").session_key
    assert store.summary("alice", key) is None
    fill(store, "alice", key, 6)
    before = store.get("alice", key)
    ids = [m.id for m in store.recent_messages("alice", key, 10)]
    first = store.append_summary("alice", key, content="They said hello.", through=ids[1],
                                 messages=2)
    second = store.append_summary("alice", key, content="They said hello twice.",
                                  through=ids[3], messages=4)
    assert isinstance(first, ConversationSummary) and first.id != second.id
    got = store.summary("alice", key)
    assert got == second
    assert (got.content, got.through, got.messages) == ("They said hello twice.", ids[3], 4)
    after = store.get("alice", key)
    assert (after.message_count, after.updated_at) == (before.message_count, before.updated_at)
    messages, _ = visible_history(store, "alice", key, limit=50)
    assert [m.id for m in messages] == ids
    store.append_message("alice", key, role="user", content="later")
    assert store.summary("alice", key) == second


def test_summary_survives_a_reopen(make_store: Callable[..., SessionStore]) -> None:
    """A summary is durable: a store opened again (a restart) reads the same one."""
    first = make_store(SessionsConfig())
    key = first.create("alice").session_key
    fill(first, "alice", key, 2)
    last = first.recent_messages("alice", key, 1)[0]
    kept = first.append_summary("alice", key, content="A greeting.", through=last.id, messages=2)
    first.close()
    again = make_store(SessionsConfig())
    assert again.summary("alice", key) == kept
    assert again.get("alice", key).message_count == 2


def test_summary_input_is_checked(store: SessionStore) -> None:
    """A bad count or a line over max_line_bytes is refused before anything is kept."""
    key = store.create("alice").session_key
    fill(store, "alice", key, 2)
    with pytest.raises(InvalidSessionInput):
        store.append_summary("alice", key, content="x", through="m", messages=0)
    with pytest.raises(InvalidSessionInput):
        store.append_summary("alice", key, content="x" * (SessionsConfig().max_line_bytes + 1),
                             through="m", messages=1)
    assert store.summary("alice", key) is None
    with pytest.raises(SessionNotFound):
        store.append_summary("bob", key, content="x", through="m", messages=1)


def test_deleted_session_loses_its_summary(store: SessionStore) -> None:
    """Deleting a session deletes its summary: reading it is SessionNotFound."""
    key = store.create("alice").session_key
    fill(store, "alice", key, 2)
    store.append_summary("alice", key, content="secret plans",
                         through=store.recent_messages("alice", key, 1)[0].id, messages=2)
    store.delete("alice", key)
    with pytest.raises(SessionNotFound):
        store.summary("alice", key)


def _dated(store: SessionStore, key: str, n: int, start: datetime) -> list[Message]:
    return [store.append_message("alice", key, role="user" if i % 2 == 0 else "assistant",
                                 content=f"m{i}", ts=start + timedelta(minutes=i))
            for i in range(n)]


def test_purge_of_a_covered_message_drops_the_summary(store: SessionStore) -> None:
    """Forgetting a message the summary covers drops the summary (it would keep the forgotten
    text); forgetting only messages after its ``through`` keeps it."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    key = store.create("alice").session_key
    msgs = _dated(store, key, 8, start)
    kept = store.append_summary("alice", key, content="m0 to m3", through=msgs[3].id, messages=4)
    # m6 and m7 come after through: the summary stays.
    assert store.purge_messages("alice", key, after=start + timedelta(minutes=6)) == 2
    assert store.summary("alice", key) == kept
    # m2 is covered: the summary goes.
    assert store.purge_messages("alice", key, after=start + timedelta(minutes=2),
                                before=start + timedelta(minutes=3)) == 1
    assert store.summary("alice", key) is None
    assert store.get("alice", key).message_count == 5


@pytest.mark.jsonl_only
def test_summary_line_format_and_readers(data_dir: Path) -> None:
    """The line is ``{"type":"summary",id,ts,content,through,messages}``; the forward reader
    (the memory indexer's) passes over it without counting it as bad, and line numbers of the
    messages after it stay their physical line numbers; a rebuilt index counts no summary."""
    store = SessionStore(data_dir)
    key = store.create("alice").session_key
    fill(store, "alice", key, 2)
    first = store.recent_messages("alice", key, 1)[0]
    store.append_summary("alice", key, content="short", through=first.id, messages=2)
    store.append_message("alice", key, role="user", content="after")
    path = store.transcript_path("alice", key)
    store.close()
    lines = read_lines(path)
    assert list(lines[3]) == ["type", "id", "ts", "content", "through", "messages"]
    assert lines[3]["type"] == SUMMARY_TYPE and lines[3]["through"] == first.id
    assert Message.from_line(lines[3]) is None
    reader = ForwardReader(path)
    entries = list(reader)
    assert [(e.line, e.message.content) for e in entries] == [(2, "m0"), (3, "m1"), (5, "after")]
    assert reader.skipped == 0 and reader.end_line == 5
    (data_dir / "sessions.db").unlink()
    rebuilt = SessionStore(data_dir)
    try:
        assert rebuilt.get("alice", key).message_count == 3
        assert rebuilt.summary("alice", key) is not None
    finally:
        rebuilt.close()
