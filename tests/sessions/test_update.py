"""SessionStore.update: an appended ``update`` line changes title and system prompt, live and
after the index is rebuilt from the transcripts, without touching messages or their order."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sessions import (
    InvalidSessionInput,
    LineTooLarge,
    SessionNotFound,
    SessionsConfig,
    SessionStore,
)

from .conftest import fill, read_lines


@pytest.mark.jsonl_only
def test_update_appends_a_line_and_changes_the_row(store: SessionStore) -> None:
    """update() writes one update line, keeps the header, and get/list show the new values."""
    s = store.create("alice", title="Old", system_prompt="Be brief.")
    fill(store, "alice", s.session_key, 2)
    before = store.get("alice", s.session_key)
    after = store.update("alice", s.session_key, title="New")
    assert (after.title, after.system_prompt) == ("New", "Be brief.")
    got = store.get("alice", s.session_key)
    assert got == after and got.updated_at == before.updated_at and got.message_count == 2
    assert store.list("alice")[0][0].title == "New"
    lines = read_lines(store.transcript_path("alice", s.session_key))
    assert (lines[0]["title"] == "Old" and lines[-1]["type"] == "update"
            and lines[-1]["title"] == "New")
    assert "systemPrompt" not in lines[-1]


def test_update_is_not_a_message(store: SessionStore) -> None:
    """History and recent_messages skip the update line; later messages append as before."""
    s = store.create("alice")
    fill(store, "alice", s.session_key, 2)
    store.update("alice", s.session_key, system_prompt="Answer in French.")
    store.append_message("alice", s.session_key, role="user", content="after")
    messages, _ = store.history("alice", s.session_key)
    assert [m.content for m in messages] == ["m0", "m1", "after"]
    assert store.get("alice", s.session_key).system_prompt == "Answer in French."


def test_rebuilt_index_applies_updates_in_order(data_dir: Path) -> None:
    """With sessions.db gone, the rebuilt row has the last update's values and counts only
    messages."""
    with SessionStore(data_dir) as store:
        key = store.create("alice", title="A").session_key
        fill(store, "alice", key, 3)
        store.update("alice", key, title="B", system_prompt="p1")
        store.update("alice", key, title="C")
        live = store.get("alice", key)
    (data_dir / "sessions.db").unlink()
    with SessionStore(data_dir) as store:
        rebuilt = store.get("alice", key)
    assert rebuilt == live
    assert (rebuilt.title, rebuilt.system_prompt, rebuilt.message_count) == ("C", "p1", 3)


@pytest.mark.parametrize(("fields", "field"), [
    ({}, "title"),
    ({"title": "  "}, "title"),
    ({"title": "x" * 201}, "title"),
    ({"system_prompt": 5}, "systemPrompt"),
])
@pytest.mark.jsonl_only
def test_bad_updates_are_refused_and_write_nothing(
    store: SessionStore, fields: dict[str, object], field: str
) -> None:
    """A missing, blank, too long or mistyped value raises InvalidSessionInput naming it; the file
    is unchanged."""
    s = store.create("alice")
    path = store.transcript_path("alice", s.session_key)
    size = path.stat().st_size
    with pytest.raises(InvalidSessionInput) as info:
        store.update("alice", s.session_key, **fields)  # type: ignore[arg-type]
    assert info.value.field == field and path.stat().st_size == size


def test_oversized_system_prompt_is_line_too_large(make_store: Callable[..., SessionStore]) -> None:
    """A system prompt that would make the line exceed max_line_bytes is refused before writing."""
    with make_store(SessionsConfig(max_line_bytes=1024)) as store:
        s = store.create("alice")
        with pytest.raises(LineTooLarge):
            store.update("alice", s.session_key, system_prompt="x" * 2000)
        assert store.get("alice", s.session_key).system_prompt is None


def test_update_of_a_foreign_or_unknown_key_is_not_found(store: SessionStore) -> None:
    """Another user's key, an unknown key and a path-like key all raise SessionNotFound."""
    s = store.create("alice")
    for user, key in (("bob", s.session_key), ("alice", "0" * 32), ("alice", "../x")):
        with pytest.raises(SessionNotFound):
            store.update(user, key, title="t")
