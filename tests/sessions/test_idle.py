"""``idle_sessions``: every user's sessions last updated before a cutoff, in bounded pages, on
each backend (the retention sweep's only way to find what it deletes)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from sessions import InvalidSessionInput, SessionsConfig, SessionStore
from sessions.idle import MAX_IDLE_PAGE

T0 = datetime(2025, 1, 10, 12, 0, tzinfo=UTC)


def test_idle_sessions_are_those_updated_before_the_cutoff_for_every_user(
    store: SessionStore
) -> None:
    """Sessions of every user whose updatedAt (last message, else creation) is before the cutoff
    are listed in (user, sessionKey) order; one updated at or after it is not."""
    old_a = store.create("alice", created_at=T0 - timedelta(days=40)).session_key
    store.append_message("alice", old_a, role="user", content="old", ts=T0 - timedelta(days=40))
    empty_b = store.create("bob", created_at=T0 - timedelta(days=50)).session_key  # no messages
    revived = store.create("bob", created_at=T0 - timedelta(days=60)).session_key
    # updatedAt == cutoff
    store.append_message("bob", revived, role="user", content="back again", ts=T0)
    store.create("carol", created_at=T0 + timedelta(days=1))
    found = store.idle_sessions(T0, limit=10)
    assert found == sorted([("alice", old_a), ("bob", empty_b)])


def test_idle_sessions_page_by_the_last_pair(store: SessionStore) -> None:
    """A page holds at most ``limit`` pairs; passing the last one back as ``after`` gives the next
    page, so the pages together hold each idle session once."""
    keys = sorted(("alice",
                   store.create("alice", created_at=T0 - timedelta(days=i + 1)).session_key)
                  for i in range(5))
    first = store.idle_sessions(T0, limit=2)
    second = store.idle_sessions(T0, limit=2, after=first[-1])
    third = store.idle_sessions(T0, limit=2, after=second[-1])
    assert (first, second, third) == (keys[:2], keys[2:4], keys[4:])
    assert store.idle_sessions(T0, limit=2, after=third[-1]) == []


def test_idle_cutoff_keeps_the_sub_millisecond_rule(store: SessionStore) -> None:
    """Timestamps are kept to the millisecond, so a session updated at 12:00:00.000 is idle for a
    cutoff of 12:00:00.000500 (it is earlier) but not for 12:00:00.000 itself."""
    key = store.create("alice", created_at=T0).session_key
    assert store.idle_sessions(T0, limit=5) == []
    assert store.idle_sessions(T0 + timedelta(microseconds=500), limit=5) == [("alice", key)]


@pytest.mark.parametrize("limit", [0, -1, True, MAX_IDLE_PAGE + 1])
def test_idle_sessions_refuses_an_unbounded_or_bad_limit(store: SessionStore, limit: int) -> None:
    """A page is bounded: a limit outside 1..MAX_IDLE_PAGE is refused, naming the field."""
    with pytest.raises(InvalidSessionInput) as info:
        store.idle_sessions(T0, limit=limit)
    assert info.value.field == "limit"


def test_idle_pages_do_not_depend_on_the_client_page_size(
    make_store: Callable[..., SessionStore]
) -> None:
    """A store whose clients may page by 1 (max_page_size = 1) still gives the sweep full pages."""
    store = make_store(SessionsConfig(max_page_size=1))
    for days in (2, 3, 4):
        store.create("alice", created_at=T0 - timedelta(days=days))
    assert len(store.idle_sessions(T0, limit=MAX_IDLE_PAGE)) == 3
