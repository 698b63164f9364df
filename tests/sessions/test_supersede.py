"""Superseded messages: a line with ``replaces`` hides the message it names and everything after
it up to itself, in the shown history, on both stores, however the pages fall."""

from __future__ import annotations

import itertools

import pytest

from sessions import REPLACES_KEY, Message, SessionStore, visible_history, visible_messages


def _say(store: SessionStore, key: str, role: str, content: str,
         replaces: str | None = None) -> Message:
    extra = {REPLACES_KEY: replaces} if replaces else None
    return store.append_message("alice", key, role=role, content=content, extra=extra)


def _conversation(store: SessionStore) -> tuple[str, list[str]]:
    """u1 a1 | u2 a2, a2 regenerated twice | u3 a3, u3 edited, its reply regenerated | u4 a4.
    Returns the key and the contents that stay shown, in order."""
    key = store.create("alice").session_key
    _say(store, key, "user", "u1")
    _say(store, key, "assistant", "a1")
    _say(store, key, "user", "u2")
    a2 = _say(store, key, "assistant", "a2")
    a2b = _say(store, key, "assistant", "a2b", replaces=a2.id)
    _say(store, key, "assistant", "a2c", replaces=a2b.id)
    u3 = _say(store, key, "user", "u3")
    _say(store, key, "assistant", "a3")
    u3b = _say(store, key, "user", "u3b", replaces=u3.id)
    a3b = _say(store, key, "assistant", "a3b")
    u3c = _say(store, key, "user", "u3c", replaces=u3b.id)
    _say(store, key, "assistant", "a3c")
    del a3b, u3c
    _say(store, key, "user", "u4")
    _say(store, key, "assistant", "a4")
    return key, ["u1", "a1", "u2", "a2c", "u3c", "a3c", "u4", "a4"]


def test_recent_messages_filtered_show_only_the_latest(store: SessionStore) -> None:
    """Filtering the whole transcript, or any suffix of it, keeps exactly the latest versions."""
    key, shown = _conversation(store)
    every = store.recent_messages("alice", key, 100)
    assert [m.content for m in visible_messages(every)] == shown
    for n in range(1, len(every) + 1):
        suffix = [m.content for m in visible_messages(every[-n:])]
        assert suffix == [c for c in shown if c in {m.content for m in every[-n:]}]


@pytest.mark.parametrize("limit", [1, 2, 3, 4, 5, 7, 50])
def test_visible_pages_cover_the_shown_messages_once_in_order(
    store: SessionStore, limit: int
) -> None:
    """Paging backwards with any page size returns every shown message once, none hidden, each
    page at most ``limit`` long and never empty while messages are left."""
    key, shown = _conversation(store)
    pages: list[list[str]] = []
    before: str | None = None
    for _ in itertools.count():
        messages, before = visible_history(store, "alice", key, limit=limit, before=before)
        assert 1 <= len(messages) <= limit
        pages.append([m.content for m in messages])
        if before is None:
            break
    assert [c for page in reversed(pages) for c in page] == shown


def test_a_transcript_without_replacements_pages_as_before(store: SessionStore) -> None:
    """Without ``replaces`` lines the shown history is the store's history, page for page."""
    key = store.create("alice").session_key
    for i in range(7):
        _say(store, key, "user" if i % 2 == 0 else "assistant", f"m{i}")
    assert visible_history(store, "alice", key, limit=3) == store.history("alice", key, limit=3)
