"""Behaviour both stores share, stated without looking at files, so it runs on each backend:
what bad input leaves behind, the line limits, purging, the incognito flag, many threads."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest

from gateway.wire import session_wire
from sessions import (
    InvalidSessionInput,
    LineTooLarge,
    Message,
    SessionNotFound,
    SessionsConfig,
    SessionStore,
    StorageError,
    visible_history,
    visible_messages,
)

from .conftest import fill


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"title": ""}, "title"), ({"model": " "}, "model"), ({"system_prompt": 3}, "systemPrompt"),
     ({"created_at": "yesterday"}, "createdAt")],
)
def test_bad_create_input_makes_no_session(
    store: SessionStore, kwargs: dict[str, object], field: str
) -> None:
    """A refused create() names its field and leaves the user's list empty."""
    with pytest.raises(InvalidSessionInput) as info:
        store.create("alice", **kwargs)  # type: ignore[arg-type]
    assert info.value.field == field
    assert store.list("alice") == ([], None)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"role": "system"}, "role"), ({"content": None}, "content"), ({"ts": "not a date"}, "ts"),
     ({"name": ""}, "name"), ({"run_id": 5}, "runId"), ({"extra": {"id": "forged"}}, "extra"),
     ({"extra": {"x": object()}}, "extra")],
)
def test_bad_message_input_changes_nothing(
    store: SessionStore, kwargs: dict[str, object], field: str
) -> None:
    """A refused append names its field; history and the session row are as before."""
    s = store.create("alice")
    fill(store, "alice", s.session_key, 2)
    before = (store.history("alice", s.session_key), store.get("alice", s.session_key))
    args: dict[str, object] = {"role": "user", "content": "ok"} | kwargs
    with pytest.raises(InvalidSessionInput) as info:
        store.append_message("alice", s.session_key, **args)  # type: ignore[arg-type]
    assert info.value.field == field
    assert (store.history("alice", s.session_key), store.get("alice", s.session_key)) == before


def test_line_limits_count_bytes_of_the_line(make_store: Callable[..., SessionStore]) -> None:
    """max_line_bytes refuses a message line (bytes, not characters) and a header whose system
    prompt is too big, before anything is stored."""
    store = make_store(SessionsConfig(max_line_bytes=4096))
    s = store.create("alice")
    with pytest.raises(LineTooLarge) as info:
        store.append_message("alice", s.session_key, role="user", content="é" * 2100)
    assert info.value.field == "message" and info.value.limit == 4096
    store.append_message("alice", s.session_key, role="user", content="x" * 3000)
    assert store.get("alice", s.session_key).message_count == 1
    with pytest.raises(LineTooLarge) as info:
        store.create("bob", system_prompt="p" * 5000)
    assert info.value.field == "systemPrompt" and store.list("bob") == ([], None)


def test_bad_update_changes_nothing(store: SessionStore) -> None:
    """A refused update names its field and the session keeps its values."""
    s = store.create("alice", title="Old")
    with pytest.raises(InvalidSessionInput) as info:
        store.update("alice", s.session_key, title="  ")
    assert info.value.field == "title" and store.get("alice", s.session_key) == s


def test_purge_removes_the_window_and_recounts(store: SessionStore) -> None:
    """purge_messages drops the messages timed in [after, before) and the row follows:
    count and updatedAt from what is left; purging everything leaves an empty session."""
    day = datetime(2026, 3, 1, tzinfo=UTC)
    s = store.create("alice", created_at=day - timedelta(days=1))
    for i in range(4):
        store.append_message("alice", s.session_key, role="user", content=f"m{i}",
                             ts=day + timedelta(days=i))
    assert store.purge_messages("alice", s.session_key, after=day + timedelta(hours=12),
                                before=day + timedelta(days=2)) == 1
    assert [m.content for m in store.history("alice", s.session_key)[0]] == ["m0", "m2", "m3"]
    assert store.get("alice", s.session_key).message_count == 3
    assert store.purge_messages("alice", s.session_key, after=day + timedelta(days=3)) == 1
    assert store.get("alice", s.session_key).updated_at == "2026-03-03T00:00:00.000Z"
    assert store.purge_messages("alice", s.session_key) == 2
    after = store.get("alice", s.session_key)
    assert (after.message_count, after.updated_at) == (0, s.created_at)
    with pytest.raises(SessionNotFound):
        store.purge_messages("bob", s.session_key)


def test_purging_an_edited_message_keeps_the_history_before_it(store: SessionStore) -> None:
    """Purging a message that a later edit replaced keeps what it hid hidden and nothing more:
    the messages before it stay shown (the edit's ``replaces`` names the first message left of
    the range it hid, or goes when none is left)."""
    day = datetime(2026, 3, 1, tzinfo=UTC)
    key = store.create("alice", created_at=day - timedelta(days=1)).session_key

    def say(text: str, hour: int, **extra: str) -> Message:
        return store.append_message("alice", key,
                                    role="user" if text.startswith("q") else "assistant",
                                    content=text, ts=day + timedelta(hours=hour),
                                    extra=extra or None)

    def shown() -> list[str]:
        return [m.content for m in visible_messages(store.recent_messages("alice", key, 50))]

    say("q1", 0)
    say("a1", 1)
    old = say("q2 old", 2)
    say("a2 old", 3)
    say("q2 new", 4, replaces=old.id)
    say("a2 new", 5)
    assert shown() == ["q1", "a1", "q2 new", "a2 new"]
    # Purge the edited-away message only: its reply stays hidden, the first exchange stays shown.
    assert store.purge_messages("alice", key, after=day + timedelta(hours=2),
                                before=day + timedelta(hours=3)) == 1
    assert shown() == ["q1", "a1", "q2 new", "a2 new"]
    assert [m.content for m in visible_history(store, "alice", key, limit=50)[0]] == [
        "q1", "a1", "q2 new", "a2 new"]
    # Purge the hidden reply too: nothing of the range is left and the edit no longer names one.
    assert store.purge_messages("alice", key, after=day + timedelta(hours=3),
                                before=day + timedelta(hours=4)) == 1
    assert shown() == ["q1", "a1", "q2 new", "a2 new"]
    assert all("replaces" not in m.extra for m in store.recent_messages("alice", key, 50))


def test_incognito_flag_is_kept_through_updates(store: SessionStore) -> None:
    """memory=False is stored, survives an update, and shows on the wire as memory: false."""
    secret = store.create("alice", memory=False)
    store.update("alice", secret.session_key, title="renamed")
    got = store.get("alice", secret.session_key)
    assert got.memory is False and session_wire(got)["memory"] is False
    assert [x.memory for x in store.list("alice")[0]] == [False]


def test_concurrent_appends_are_whole_and_counted(store: SessionStore) -> None:
    """Eight threads appending to one session and their own: none lost, none doubled, and
    each session's count matches its history."""
    shared = store.create("alice").session_key
    own = [store.create("alice").session_key for _ in range(4)]
    start = threading.Barrier(8)

    def work(worker: int) -> None:
        start.wait()
        for i in range(20):
            key = shared if i % 2 == 0 else own[worker % 4]
            store.append_message("alice", key, role="user", content=f"w{worker}-{i}")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(work, range(8)))
    messages = store.recent_messages("alice", shared, 1000)
    assert sorted(m.content for m in messages) == sorted(
        f"w{w}-{i}" for w in range(8) for i in range(0, 20, 2))
    assert store.get("alice", shared).message_count == len(messages) == 80
    for key in own:
        assert store.get("alice", key).message_count == len(
            store.recent_messages("alice", key, 1000)) == 20


def test_reopened_store_sees_everything(make_store: Callable[..., SessionStore]) -> None:
    """A second store on the same data (a restart, or another node) reads what the first wrote."""
    first = make_store()
    s = first.create("alice", title="kept", system_prompt="p")
    fill(first, "alice", s.session_key, 3)
    first.close()
    second = make_store()
    assert second.get("alice", s.session_key).system_prompt == "p"
    assert [m.content for m in second.history("alice", s.session_key)[0]] == ["m0", "m1", "m2"]


def test_a_chosen_session_key_names_the_session_once(store: SessionStore) -> None:
    """create(session_key=…) makes the session under that key (an import's stable key); the same
    key again is a StorageError and a malformed one InvalidSessionInput, and neither adds one."""
    key = "0123456789abcdef0123456789abcdef"
    session = store.create("alice", title="imported", session_key=key)
    assert session.session_key == key
    assert store.get("alice", "0123456789abcdef0123456789abcdef").title == "imported"
    with pytest.raises(StorageError):
        store.create("alice", session_key="0123456789abcdef0123456789abcdef")
    with pytest.raises(InvalidSessionInput) as bad:
        store.create("alice", session_key="../escape")
    assert bad.value.field == "sessionKey"
    assert [s.session_key for s in store.list("alice")[0]] == ["0123456789abcdef0123456789abcdef"]
