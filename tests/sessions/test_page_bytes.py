"""History pages capped by bytes (``sessions.max_page_bytes``) as well as by count: a page
stops before the message that would pass the cap, and its cursor resumes exactly there."""

from __future__ import annotations

from collections.abc import Callable

from sessions import SessionsConfig, SessionStore


def _all_pages(store: SessionStore, key: str, limit: int) -> list[list[str]]:
    pages: list[list[str]] = []
    before: str | None = None
    while True:
        messages, before = store.history("alice", key, limit=limit, before=before)
        pages.append([m.content for m in messages])
        if before is None:
            return pages


def test_pages_stop_at_the_byte_cap_and_resume_where_they_stopped(
    make_store: Callable[..., SessionStore]
) -> None:
    """Messages of mixed sizes under a 20 kB cap: every page's lines fit the cap (or it is a
    single message), and paging back to the start yields every message once, in order."""
    sizes = [100, 9_000, 3_000, 15_000, 50, 8_000, 8_000, 30_000, 200, 7_000, 12_000, 1]
    with make_store(SessionsConfig(max_page_bytes=20_000)) as store:
        key = store.create("alice").session_key
        contents = [f"{i:02d}" + "x" * n for i, n in enumerate(sizes)]
        for content in contents:
            store.append_message("alice", key, role="user", content=content)
        pages = _all_pages(store, key, limit=200)
        seen = [c for page in reversed(pages) for c in page]
        assert seen == contents  # none lost, none repeated, oldest first
        for page in pages:
            # A line is its content plus about a hundred bytes of JSON: every page of more than
            # one message fits the cap.
            assert len(page) == 1 or sum(len(c) + 100 for c in page) <= 20_000, page
        # Newest first: 1 + 12,000 + 7,000 + 200 fit; 30,000 more would not, and alone it is
        # still served (one message at least), and so on back to the start.
        assert [[c[:2] for c in page] for page in pages] == [
            ["08", "09", "10", "11"], ["07"], ["04", "05", "06"], ["02", "03"], ["00", "01"]]

def test_the_count_limit_still_applies_under_the_byte_cap(
    make_store: Callable[..., SessionStore]
) -> None:
    """Small messages under a large cap page by ``limit`` exactly as before."""
    with make_store(SessionsConfig(max_page_bytes=1_000_000)) as store:
        key = store.create("alice").session_key
        contents = [f"m{i}" for i in range(7)]
        for content in contents:
            store.append_message("alice", key, role="user", content=content)
        assert _all_pages(store, key, limit=3) == [["m4", "m5", "m6"], ["m1", "m2", "m3"], ["m0"]]


def test_the_chat_context_is_capped_by_bytes_keeping_the_newest_whole(
    make_store: Callable[..., SessionStore],
) -> None:
    """Issue 22, item 13: a session of 20 messages of 256 KiB does not load 5 MiB for a reply.
    recent_messages reads at most sessions.max_context_bytes (default 1 MiB) of lines: the
    newest messages, whole and in order; older ones are dropped."""
    big = 256 * 1024
    with make_store(SessionsConfig()) as store:
        key = store.create("alice").session_key
        contents = [f"{i:02d}" + "y" * big for i in range(20)]
        for content in contents:
            store.append_message("alice", key, role="user", content=content)
        got = [m.content for m in store.recent_messages("alice", key, 50)]
        assert got == contents[-len(got):]
        assert 1 <= len(got) <= 4 and sum(len(c) for c in got) <= SessionsConfig().max_context_bytes


def test_the_newest_message_is_kept_even_past_the_context_cap(
    make_store: Callable[..., SessionStore],
) -> None:
    """A cap smaller than the newest message still yields that message, whole."""
    with make_store(SessionsConfig(max_context_bytes=1_000)) as store:
        key = store.create("alice").session_key
        store.append_message("alice", key, role="user", content="small")
        store.append_message("alice", key, role="assistant", content="z" * 5_000)
        assert [m.content for m in store.recent_messages("alice", key, 10)] == ["z" * 5_000]
