"""Creating, reading, listing and deleting sessions, and who may see them."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from gateway.wire import session_wire
from sessions import (
    InvalidSessionInput,
    SessionNotFound,
    SessionsConfig,
    SessionStore,
    StorageError,
)

from .conftest import fill, read_lines


@pytest.mark.jsonl_only
def test_create_writes_exactly_the_header_line(store: SessionStore) -> None:
    """create() makes a transcript whose only line is the header, keys in the documented order
    (docs/sessions.md)."""
    s = store.create("alice", title="Trip", system_prompt="Be brief.", model="gpt-x")
    path = store.transcript_path("alice", s.session_key)
    lines = read_lines(path)
    assert lines == [
        {
            "type": "session",
            "version": 1,
            "sessionKey": s.session_key,
            "user": "alice",
            "createdAt": s.created_at,
            "title": "Trip",
            "systemPrompt": "Be brief.",
            "model": "gpt-x",
        }
    ]
    assert list(lines[0]) == [
        "type", "version", "sessionKey", "user", "createdAt", "title", "systemPrompt", "model",
    ]
    assert path == store.transcript_path("alice", s.session_key)
    assert path.parent.parent.name == "sessions"


@pytest.mark.jsonl_only
def test_create_defaults_and_unguessable_keys(store: SessionStore) -> None:
    """Without arguments a session gets the default title, no prompt or model, and a fresh
    32-hex-digit key."""
    a, b = store.create("alice"), store.create("alice")
    assert a.title == "New session" and a.system_prompt is None and a.model is None
    assert a.message_count == 0 and a.updated_at == a.created_at
    assert a.session_key != b.session_key and len(a.session_key) == 32
    assert "systemPrompt" not in read_lines(store.transcript_path("alice", a.session_key))[0]


@pytest.mark.jsonl_only
def test_transcripts_are_private_files(store: SessionStore) -> None:
    """Transcripts are created mode 0600 inside a 0700 user directory."""
    s = store.create("alice")
    path = store.transcript_path("alice", s.session_key)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_get_and_wire_shape(store: SessionStore) -> None:
    """get() returns what create() returned, and session_wire() is the camelCase wire shape
    (docs/protocol.md)."""
    s = store.create("alice", title="T", model="m1")
    assert store.get("alice", s.session_key) == s
    assert session_wire(s) == {
        "sessionKey": s.session_key,
        "title": "T",
        "createdAt": s.created_at,
        "updatedAt": s.updated_at,
        "messageCount": 0,
        "model": "m1",
    }


def test_create_with_dataset_date(store: SessionStore) -> None:
    """created_at sets the header date, normalised to UTC milliseconds with Z."""
    s = store.create("alice", created_at="2023-05-20T02:21:00+02:00")
    assert s.created_at == "2023-05-20T00:21:00.000Z"
    assert store.get("alice", s.session_key).created_at == "2023-05-20T00:21:00.000Z"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"title": ""}, "title"),
        ({"title": "x" * 201}, "title"),
        ({"title": 5}, "title"),
        ({"model": " "}, "model"),
        ({"system_prompt": 3}, "systemPrompt"),
        ({"created_at": "yesterday"}, "createdAt"),
    ],
)
@pytest.mark.jsonl_only
def test_create_rejects_bad_input(
    store: SessionStore, kwargs: dict[str, object], field: str
) -> None:
    """Each bad create() argument is refused with the wire name of its field and no file made."""
    with pytest.raises(InvalidSessionInput) as info:
        store.create("alice", **kwargs)  # type: ignore[arg-type]
    assert info.value.field == field
    assert not (store.transcript_path("alice", "0" * 32).parent).exists()


@pytest.mark.parametrize("user", ["", ".", "..", "a/b", "../x", "a" * 65, "é", "a b", None])
def test_bad_user_names_are_refused(store: SessionStore, user: object) -> None:
    """A user name that could not be a plain directory name is refused before any I/O."""
    with pytest.raises(InvalidSessionInput) as info:
        store.create(user)  # type: ignore[arg-type]
    assert info.value.field == "user"


def test_list_is_newest_first(store: SessionStore) -> None:
    """list() orders by updatedAt descending, and a session with a new message moves first."""
    older = store.create("alice", created_at="2024-01-01T00:00:00Z")
    newer = store.create("alice", created_at="2024-02-01T00:00:00Z")
    sessions, cursor = store.list("alice")
    assert [s.session_key for s in sessions] == [newer.session_key, older.session_key]
    assert cursor is None
    store.append_message("alice", older.session_key, role="user", content="hi",
                         ts="2024-03-01T00:00:00Z")
    sessions, _ = store.list("alice")
    assert [s.session_key for s in sessions] == [older.session_key, newer.session_key]
    assert sessions[0].updated_at == "2024-03-01T00:00:00.000Z"
    assert sessions[0].message_count == 1


def test_list_ties_break_by_key_descending(store: SessionStore) -> None:
    """Sessions with the same updatedAt are ordered by session key, descending,
    deterministically."""
    keys = [store.create("alice", created_at="2024-01-01T00:00:00Z").session_key for _ in range(5)]
    sessions, _ = store.list("alice")
    assert [s.session_key for s in sessions] == sorted(keys, reverse=True)


def test_list_pages_cover_every_session_once(store: SessionStore) -> None:
    """Following cursors yields every session exactly once, in order, and ends with None."""
    made = [
        store.create("alice", created_at=f"2024-01-01T00:00:{i:02d}Z").session_key
        for i in range(23)
    ]
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        page, cursor = store.list("alice", limit=5, before=cursor)
        seen += [s.session_key for s in page]
        pages += 1
        if cursor is None:
            break
    assert seen == list(reversed(made))
    assert pages == 5


def test_list_exact_multiple_has_no_empty_last_page(store: SessionStore) -> None:
    """When the sessions fill the last page exactly, that page already returns no cursor."""
    for _ in range(4):
        store.create("alice")
    page, cursor = store.list("alice", limit=2)
    page2, cursor2 = store.list("alice", limit=2, before=cursor)
    assert len(page) == len(page2) == 2 and cursor is not None and cursor2 is None


@pytest.mark.parametrize("limit", [0, 201, -1, "5", True, 2.0])
def test_list_limit_is_validated(store: SessionStore, limit: object) -> None:
    """limit must be an integer from 1 to 200."""
    with pytest.raises(InvalidSessionInput) as info:
        store.list("alice", limit=limit)  # type: ignore[arg-type]
    assert info.value.field == "limit"
    assert isinstance(info.value, InvalidSessionInput)


@pytest.mark.parametrize("cursor", ["", "nonsense", "!!!!", "czEyMzQ", "x" * 500])
def test_list_rejects_foreign_cursors(store: SessionStore, cursor: str) -> None:
    """A cursor this server did not issue is an invalid 'before', never a crash."""
    with pytest.raises(InvalidSessionInput) as info:
        store.list("alice", before=cursor)
    assert info.value.field == "before"


def test_another_users_key_is_not_found_like_an_unknown_key(store: SessionStore) -> None:
    """Every method answers another user's key exactly as it answers a key that never existed."""
    s = store.create("alice")
    fill(store, "alice", s.session_key, 2)
    unknown = "f" * 32
    for key in (s.session_key, unknown):
        calls: list[Callable[[], object]] = [
            partial(store.get, "bob", key),
            partial(store.history, "bob", key),
            partial(store.recent_messages, "bob", key, 5),
            partial(store.append_message, "bob", key, role="user", content="x"),
            partial(store.delete, "bob", key),
        ]
        for call in calls:
            with pytest.raises(SessionNotFound) as info:
                call()
            assert str(info.value) == "session not found"
            assert isinstance(info.value, SessionNotFound)
    assert store.list("bob") == ([], None)
    assert store.get("alice", s.session_key).message_count == 2


@pytest.mark.parametrize(
    "key",
    [
        "../../etc/passwd",
        "../alice/" + "a" * 32,
        "/etc/passwd",
        "A" * 32,
        "a" * 31,
        "a" * 33,
        "a" * 32 + "\n",
        "a" * 32 + ".jsonl",
        "",
        None,
        42,
    ],
)
def test_path_like_keys_are_not_found_and_touch_nothing(
    tmp_path: Path, store: SessionStore, key: object
) -> None:
    """A malformed key is SessionNotFound with the usual message, and no file anywhere changes."""
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes(b"keep\n")

    def snapshot() -> dict[str, tuple[int, int]]:
        return {
            str(p): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in tmp_path.rglob("*")
            if p.is_file() and not p.name.startswith("sessions.db")
        }

    before = snapshot()
    calls: list[Callable[[], object]] = [
        lambda: store.get("alice", key),  # type: ignore[arg-type]
        lambda: store.history("alice", key),  # type: ignore[arg-type]
        lambda: store.append_message("alice", key, role="user", content="x"),  # type: ignore[arg-type]
        lambda: store.delete("alice", key),  # type: ignore[arg-type]
        lambda: store.transcript_path("alice", key),  # type: ignore[arg-type]
    ]
    for call in calls:
        with pytest.raises(SessionNotFound, match="^session not found$"):
            call()
    assert snapshot() == before
    assert outside.read_bytes() == b"keep\n"


@pytest.mark.jsonl_only
def test_delete_removes_file_row_and_saved_tails(store: SessionStore, data_dir: Path) -> None:
    """delete() removes the transcript, its .corrupt-* files and its index row; then it is gone."""
    s = store.create("alice")
    path = store.transcript_path("alice", s.session_key)
    aside = path.with_name(path.name + ".corrupt-20240101T000000000Z")
    aside.write_bytes(b"junk")
    keep = store.create("alice")
    store.delete("alice", s.session_key)
    assert not path.exists() and not aside.exists()
    assert [x.session_key for x in store.list("alice")[0]] == [keep.session_key]
    with pytest.raises(SessionNotFound):
        store.get("alice", s.session_key)
    with pytest.raises(SessionNotFound):
        store.delete("alice", s.session_key)
    store.close()
    reopened = SessionStore(data_dir)
    assert [x.session_key for x in reopened.list("alice")[0]] == [keep.session_key]
    reopened.close()


def test_close_twice_is_safe_and_later_calls_fail_cleanly(
    make_store: Callable[..., SessionStore]
) -> None:
    """close() may be called twice; a call after close raises StorageError, not an apsw error."""
    s = make_store(SessionsConfig(fsync="batch"))
    session = s.create("alice")
    s.close()
    s.close()
    with pytest.raises(StorageError):
        s.get("alice", session.session_key)


def test_context_manager_closes(data_dir: Path) -> None:
    """Using the store as a context manager closes it, flushing pending fsyncs."""
    with SessionStore(data_dir) as s:
        s.create("alice")
    with pytest.raises(StorageError):
        s.list("alice")
    assert os.listdir(data_dir / "sessions" / "alice")


@pytest.mark.jsonl_only
def test_no_file_descriptors_are_kept_per_session(store: SessionStore) -> None:
    """Using a thousand sessions leaves the process holding no more descriptors than before."""
    fd_dir = Path("/proc/self/fd")
    if not fd_dir.exists():
        pytest.skip("needs /proc to count descriptors")
    store.create("alice")  # let the index open its WAL files first
    before = len(os.listdir(fd_dir))
    for _ in range(1000):
        key = store.create("alice").session_key
        store.append_message("alice", key, role="user", content="x")
        store.history("alice", key)
    store.flush()
    assert len(os.listdir(fd_dir)) <= before
