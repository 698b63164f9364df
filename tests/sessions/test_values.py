"""Timestamps, wire shapes, cursors, names and settings: the small values the store is built on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from gateway.wire import session_wire
from sessions import Message, Session, SessionsConfig, format_ts, parse_ts
from sessions.keys import (
    check_user,
    decode_history_cursor,
    decode_list_cursor,
    encode_history_cursor,
    encode_list_cursor,
    is_session_key,
    new_session_key,
)


def test_timestamp_format_is_fixed_width_utc_millis() -> None:
    """format_ts writes YYYY-MM-DDTHH:MM:SS.mmmZ in UTC, zero-padded, truncating to ms."""
    tz = timezone(timedelta(hours=5, minutes=30))
    assert format_ts(datetime(2026, 11, 22, 15, 30, 0, 123999, tzinfo=tz)) == (
        "2026-11-22T10:00:00.123Z"
    )
    assert format_ts(datetime(999, 1, 2, 3, 4, 5, tzinfo=UTC)) == "0999-01-02T03:04:05.000Z"
    assert format_ts(datetime(2024, 1, 1)) == "2024-01-01T00:00:00.000Z"


def test_timestamps_sort_in_time_order() -> None:
    """Formatted timestamps sort as strings in the same order as the instants they name."""
    base = datetime(2024, 1, 1, tzinfo=UTC)
    moments = [base + timedelta(milliseconds=ms) for ms in (0, 1, 10, 999, 1000, 86_400_000)]
    texts = [format_ts(m) for m in moments]
    assert sorted(texts) == texts
    assert [parse_ts(t) for t in texts] == moments


def test_session_wire_leaves_out_absent_optionals() -> None:
    """session_wire omits systemPrompt and model when unset, and never includes the user."""
    s = Session("a" * 32, "alice", "T", "2024-01-01T00:00:00.000Z", "2024-01-01T00:00:00.000Z", 0)
    assert set(session_wire(s)) == {"sessionKey", "title", "createdAt", "updatedAt", "messageCount"}


@pytest.mark.parametrize(
    "line",
    [
        {"type": "session"},
        {"type": "message", "id": 1, "role": "user", "content": "x", "ts": "t"},
        {"type": "message", "id": "1", "role": "user", "content": None, "ts": "t"},
        {"type": "message", "id": "1", "role": "user", "content": "x", "ts": "t", "runId": 3},
        {"type": "message", "id": "1", "role": "user", "content": "x"},
    ],
)
def test_message_from_line_rejects_malformed_lines(line: dict[str, object]) -> None:
    """Message.from_line returns None for anything but a well-formed message line."""
    assert Message.from_line(line) is None


def test_message_line_round_trip() -> None:
    """A message survives to_line -> from_line unchanged, extras included."""
    m = Message("i", "assistant", "c", "2024-01-01T00:00:00.000Z", "r", "Ada", {"aborted": True})
    assert Message.from_line(m.to_line()) == m


def test_session_keys_are_random_hex() -> None:
    """New keys are 32 lower-case hex digits and differ every time."""
    keys = {new_session_key() for _ in range(1000)}
    assert len(keys) == 1000 and all(is_session_key(k) for k in keys)


def test_cursors_round_trip_and_are_tied_to_their_kind() -> None:
    """List and history cursors decode to what was encoded; a history cursor only fits its own
    session."""
    key = new_session_key()
    assert decode_list_cursor(encode_list_cursor("2024-01-01T00:00:00.000Z", key)) == (
        "2024-01-01T00:00:00.000Z", key,
    )
    assert decode_history_cursor(encode_history_cursor(key, 1234), key) == 1234
    with pytest.raises(Exception, match="cursor"):
        decode_history_cursor(encode_history_cursor(key, 1234), new_session_key())
    with pytest.raises(Exception, match="cursor"):
        decode_list_cursor(encode_history_cursor(key, 1234))


@pytest.mark.parametrize("name", ["alice", "a.b", "A_9-z", "x" * 64, "..a", ".hidden"])
def test_acceptable_user_names(name: str) -> None:
    """Names of 1-64 characters from [A-Za-z0-9_.-], other than '.' and '..', are accepted."""
    assert check_user(name) == name


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"fsync": "sometimes"}, "sessions.fsync"),
        ({"max_line_bytes": 10}, "sessions.max_line_bytes"),
        ({"fsync_interval_s": 0}, "sessions.fsync_interval_s"),
        ({"max_page_size": 0}, "sessions.max_page_size"),
        ({"max_title_chars": 0}, "sessions.max_title_chars"),
    ],
)
def test_config_refuses_unworkable_values(kwargs: dict[str, object], key: str) -> None:
    """SessionsConfig refuses values that could not work, naming the key in the message."""
    with pytest.raises(ValueError, match=key):
        SessionsConfig(**kwargs)  # type: ignore[arg-type]


def test_config_defaults() -> None:
    """The defaults are the documented ones."""
    c = SessionsConfig()
    assert (c.fsync, c.fsync_interval_s, c.max_line_bytes, c.max_page_size) == (
        "batch", 1.0, 1_048_576, 200,
    )
