"""Appending message lines and reading them back a page at a time."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from gateway.wire import message_wire
from sessions import (
    InvalidSessionInput,
    LineTooLarge,
    Message,
    SessionsConfig,
    SessionStore,
)

from .conftest import fill, read_lines


@pytest.mark.jsonl_only
def test_append_line_format_is_design_3(store: SessionStore) -> None:
    """A message line is {type,id,role,content,ts,runId,name?,...extra} in that order, one line."""
    s = store.create("alice")
    m = store.append_message(
        "alice", s.session_key, role="assistant", content="line one\nline two", run_id="r1",
        name="Ada", extra={"model": "gpt-x", "usage": {"totalTokens": 7}, "finishReason": "stop"},
    )
    raw = store.transcript_path("alice", s.session_key).read_bytes().splitlines(keepends=True)
    assert len(raw) == 2 and raw[1].endswith(b"\n") and raw[1].count(b"\n") == 1
    line = orjson.loads(raw[1])
    assert list(line) == [
        "type", "id", "role", "content", "ts", "runId", "name", "model", "usage", "finishReason",
    ]
    assert line == {
        "type": "message", "id": m.id, "role": "assistant", "content": "line one\nline two",
        "ts": m.ts, "runId": "r1", "name": "Ada", "model": "gpt-x",
        "usage": {"totalTokens": 7}, "finishReason": "stop",
    }


@pytest.mark.jsonl_only
def test_append_without_run_id_or_name(store: SessionStore) -> None:
    """runId is always present (null when unset) and name only when given."""
    s = store.create("alice")
    store.append_message("alice", s.session_key, role="user", content="hi")
    line = read_lines(store.transcript_path("alice", s.session_key))[1]
    assert line["runId"] is None and "name" not in line


def test_message_wire_shape(store: SessionStore) -> None:
    """message_wire() is {id,role,content,ts} plus runId, name and extra keys when present."""
    s = store.create("alice")
    m = store.append_message("alice", s.session_key, role="assistant", content="par",
                             run_id="r9", extra={"aborted": True})
    assert message_wire(m) == {"id": m.id, "role": "assistant", "content": "par", "ts": m.ts,
                           "runId": "r9", "aborted": True}
    plain = store.append_message("alice", s.session_key, role="user", content="q")
    assert message_wire(plain) == {"id": plain.id, "role": "user", "content": "q", "ts": plain.ts}


def test_append_updates_metadata(store: SessionStore) -> None:
    """Each append bumps messageCount and sets updatedAt to the message's ts."""
    s = store.create("alice", created_at="2024-01-01T00:00:00Z")
    store.append_message("alice", s.session_key, role="user", content="a",
                         ts=datetime(2024, 1, 2, tzinfo=UTC))
    got = store.get("alice", s.session_key)
    assert got.message_count == 1 and got.updated_at == "2024-01-02T00:00:00.000Z"


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("2023-05-20T02:21:00Z", "2023-05-20T02:21:00.000Z"),
        ("2023-05-20T04:21:00.1234+02:00", "2023-05-20T02:21:00.123Z"),
        ("2023-05-20T02:21:00", "2023-05-20T02:21:00.000Z"),
        (datetime(2023, 5, 20, 2, 21, 0, 999999), "2023-05-20T02:21:00.999Z"),
    ],
)
@pytest.mark.jsonl_only
def test_ts_is_normalised_to_utc_millis(store: SessionStore, given: object, stored: str) -> None:
    """A given ts (string or datetime; naive means UTC) is stored as UTC with milliseconds and Z."""
    s = store.create("alice")
    m = store.append_message("alice", s.session_key, role="user", content="x", ts=given)  # type: ignore[arg-type]
    assert m.ts == stored
    assert read_lines(store.transcript_path("alice", s.session_key))[1]["ts"] == stored


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"role": "system"}, "role"),
        ({"role": "tool"}, "role"),
        ({"content": None}, "content"),
        ({"content": "bad \ud800 surrogate"}, "content"),
        ({"ts": "not a date"}, "ts"),
        ({"ts": 12}, "ts"),
        ({"name": ""}, "name"),
        ({"name": "n" * 129}, "name"),
        ({"run_id": 5}, "runId"),
        ({"extra": {"id": "forged"}}, "extra"),
        ({"extra": {"type": "session"}}, "extra"),
        ({"extra": {"x": object()}}, "extra"),
        ({"extra": {1: "x"}}, "extra"),
        ({"extra": ["x"]}, "extra"),
    ],
)
@pytest.mark.jsonl_only
def test_bad_message_input_writes_nothing(
    store: SessionStore, kwargs: dict[str, object], field: str
) -> None:
    """Each bad append argument is refused with its field name and the transcript is unchanged."""
    s = store.create("alice")
    path = store.transcript_path("alice", s.session_key)
    before = path.read_bytes()
    args: dict[str, object] = {"role": "user", "content": "ok"} | kwargs
    with pytest.raises(InvalidSessionInput) as info:
        store.append_message("alice", s.session_key, **args)  # type: ignore[arg-type]
    assert info.value.field == field
    assert path.read_bytes() == before


def test_line_too_large_is_refused_before_writing(data_dir: Path) -> None:
    """A line over max_line_bytes raises LineTooLarge(field='message') and writes nothing."""
    store = SessionStore(data_dir, SessionsConfig(max_line_bytes=4096))
    s = store.create("alice")
    path = store.transcript_path("alice", s.session_key)
    before = path.read_bytes()
    with pytest.raises(LineTooLarge) as info:
        store.append_message("alice", s.session_key, role="user", content="x" * 5000)
    assert info.value.field == "message" and isinstance(info.value, InvalidSessionInput)
    assert info.value.limit == 4096 and info.value.size > 5000
    assert "max_line_bytes" in str(info.value)
    assert path.read_bytes() == before
    assert store.get("alice", s.session_key).message_count == 0
    # Multi-byte text counts in bytes, not characters.
    with pytest.raises(LineTooLarge):
        store.append_message("alice", s.session_key, role="user", content="é" * 2100)
    store.append_message("alice", s.session_key, role="user", content="x" * 3000)
    assert store.get("alice", s.session_key).message_count == 1
    store.close()


def test_oversized_header_is_refused_and_no_file_made(data_dir: Path) -> None:
    """A system prompt that would push the header past max_line_bytes is refused, no file made."""
    store = SessionStore(data_dir, SessionsConfig(max_line_bytes=2048))
    with pytest.raises(LineTooLarge) as info:
        store.create("alice", system_prompt="p" * 3000)
    assert info.value.field == "systemPrompt"
    assert store.list("alice") == ([], None)
    assert not any((data_dir / "sessions").rglob("*.jsonl"))
    store.close()


def test_history_pages_backwards_in_chronological_order(store: SessionStore) -> None:
    """history() returns the latest page oldest-first, and cursors walk to the start then None."""
    s = store.create("alice")
    contents = fill(store, "alice", s.session_key, 7)
    page, cursor = store.history("alice", s.session_key, limit=3)
    assert [m.content for m in page] == contents[4:7]
    page, cursor = store.history("alice", s.session_key, limit=3, before=cursor)
    assert [m.content for m in page] == contents[1:4]
    page, cursor = store.history("alice", s.session_key, limit=3, before=cursor)
    assert [m.content for m in page] == contents[0:1]
    assert cursor is None


def test_history_of_exactly_limit_messages_has_no_cursor(store: SessionStore) -> None:
    """When the page holds every remaining message, no cursor is returned."""
    s = store.create("alice")
    fill(store, "alice", s.session_key, 3)
    page, cursor = store.history("alice", s.session_key, limit=3)
    assert len(page) == 3 and cursor is None


def test_history_of_new_session_is_empty(store: SessionStore) -> None:
    """A session with only its header has an empty history and no cursor."""
    s = store.create("alice")
    assert store.history("alice", s.session_key) == ([], None)


def test_history_cursor_is_stable_while_appending(store: SessionStore) -> None:
    """Messages appended after a page was read do not shift the older pages."""
    s = store.create("alice")
    contents = fill(store, "alice", s.session_key, 5)
    _, cursor = store.history("alice", s.session_key, limit=2)
    fill(store, "alice", s.session_key, 3, prefix="late")
    page, _ = store.history("alice", s.session_key, limit=2, before=cursor)
    assert [m.content for m in page] == contents[1:3]


def test_history_round_trips_long_multiline_messages(store: SessionStore) -> None:
    """Messages longer than the 64 KiB read block come back intact and in order."""
    s = store.create("alice")
    big = ["a" * 200_000, "b\n" * 70_000, "ü" * 100_000]
    for text in big:
        store.append_message("alice", s.session_key, role="assistant", content=text)
    page, cursor = store.history("alice", s.session_key, limit=2)
    assert [m.content for m in page] == big[1:]
    page, cursor = store.history("alice", s.session_key, limit=2, before=cursor)
    assert [m.content for m in page] == big[:1] and cursor is None


def test_history_rejects_forged_cursors(store: SessionStore) -> None:
    """A cursor from another session, a list cursor, or a forged offset is an invalid 'before'."""
    a, b = store.create("alice"), store.create("alice")
    fill(store, "alice", a.session_key, 4)
    fill(store, "alice", b.session_key, 4)
    _, cursor_b = store.history("alice", b.session_key, limit=1)
    store.create("alice")
    _, list_cursor = store.list("alice", limit=1)
    import base64

    mid_line = base64.urlsafe_b64encode(f"m|{a.session_key}|5".encode()).decode().rstrip("=")
    past_end = base64.urlsafe_b64encode(f"m|{a.session_key}|999999".encode()).decode()
    for bad in (cursor_b, list_cursor, mid_line, past_end, "garbage", ""):
        with pytest.raises(InvalidSessionInput) as info:
            store.history("alice", a.session_key, before=bad)
        assert info.value.field == "before"


def test_history_limit_is_validated(store: SessionStore) -> None:
    """history() limit must be 1..200."""
    s = store.create("alice")
    for limit in (0, 201):
        with pytest.raises(InvalidSessionInput) as info:
            store.history("alice", s.session_key, limit=limit)
        assert info.value.field == "limit"


def test_recent_messages_for_model_context(store: SessionStore) -> None:
    """recent_messages(n) returns the last n messages in order, beyond the page cap, n=0 empty."""
    s = store.create("alice")
    contents = fill(store, "alice", s.session_key, 250)
    got = store.recent_messages("alice", s.session_key, 220)
    assert [m.content for m in got] == contents[-220:]
    assert all(isinstance(m, Message) for m in got)
    assert store.recent_messages("alice", s.session_key, 0) == []
    with pytest.raises(InvalidSessionInput):
        store.recent_messages("alice", s.session_key, -1)


@pytest.mark.jsonl_only
def test_history_reads_lines_written_by_the_store_only_once_each(store: SessionStore) -> None:
    """Every message id in the transcript appears exactly once across all history pages."""
    s = store.create("alice")
    fill(store, "alice", s.session_key, 41)
    ids: list[str] = []
    cursor = None
    while True:
        page, cursor = store.history("alice", s.session_key, limit=7, before=cursor)
        ids = [m.id for m in page] + ids
        if cursor is None:
            break
    on_disk = [line["id"] for line in read_lines(store.transcript_path("alice", s.session_key))[1:]]
    assert ids == on_disk
