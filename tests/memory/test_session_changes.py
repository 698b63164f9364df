"""What the index makes of the sessions store's changes, on both backends: an edited message
and a regenerated reply, purged messages, incognito sessions, and status per user."""

from __future__ import annotations

from datetime import timedelta

from tests.memory.conftest import (
    BASE_TIME,
    BackendMemory,
    MemoryBackend,
    name_of,
    ts,
)


async def found(svc: BackendMemory, query: str, user: str = "alice") -> list[str]:
    """The names of the sessions a keyword search finds, best first."""
    return [name_of(h.session_key) for h in (await svc.search(user, query, mode="keyword")).results]


async def test_an_edited_message_and_the_reply_to_it_leave_the_index(
        memory_backend: MemoryBackend, memory_service: BackendMemory) -> None:
    """Editing a message supersedes it and the reply after it: neither is found any more, and
    the edited text is, in a chunk that holds nothing of the old ones."""
    memory_backend.write("alice", "trip", ["we fly to Oslo on Monday", "Oslo it is, then"])
    await memory_service.sync_now()
    first = memory_backend.messages("alice", "trip")[0]
    memory_backend.supersede("alice", "trip", first.id, "we fly to Bergen on Monday", minute=5)
    await memory_service.sync_now()
    assert await found(memory_service, "Oslo") == []
    hits = (await memory_service.search("alice", "Bergen", mode="keyword")).results
    assert [h.content for h in hits] == [f"user [{ts(5)}]: we fly to Bergen on Monday"]
    assert (hits[0].line_start, hits[0].line_end) == (4, 4)


async def test_a_regenerated_reply_replaces_the_old_one_on_the_next_line(
        memory_backend: MemoryBackend, memory_service: BackendMemory) -> None:
    """A regenerated reply hides the reply it replaces: the chunk holds the question and the new
    reply, on the question's line through the new reply's."""
    memory_backend.write("alice", "quiz", ["what is the capital of Norway?", "it is Bergen"])
    await memory_service.sync_now()
    reply = memory_backend.messages("alice", "quiz")[1]
    memory_backend.supersede("alice", "quiz", reply.id, "it is Oslo", role="assistant", minute=5)
    await memory_service.sync_now()
    assert await found(memory_service, "Bergen") == []
    hits = (await memory_service.search("alice", "capital Norway Oslo", mode="keyword")).results
    assert [h.content for h in hits] == [f"user [{ts(0)}]: what is the capital of Norway?\n"
                                         f"assistant [{ts(5)}]: it is Oslo"]
    assert (hits[0].line_start, hits[0].line_end) == (2, 4)


async def test_purged_messages_leave_the_index(memory_backend: MemoryBackend,
                                               memory_service: BackendMemory) -> None:
    """Messages purged from a session (memory.forget with purgeTranscript) are gone from the
    index after the next sync; the session's other messages stay searchable."""
    memory_backend.write("alice", "day",
                         ["breakfast was porridge", "lunch was ramen", "dinner was risotto"])
    await memory_service.sync_now()
    assert memory_backend.purge("alice", "day", after=BASE_TIME + timedelta(minutes=1),
                                before=BASE_TIME + timedelta(minutes=2)) == 1
    await memory_service.sync_now()
    assert await found(memory_service, "ramen") == []
    assert (await found(memory_service, "porridge") == ["day"]
            and await found(memory_service, "risotto") == ["day"])


async def test_an_incognito_session_is_never_indexed(memory_backend: MemoryBackend,
                                                     memory_service: BackendMemory) -> None:
    """A session created with memory off is not indexed, searched or counted; its neighbour is."""
    memory_backend.write("alice", "secret", ["the lighthouse ghost is a secret"], memory=False)
    memory_backend.write("alice", "plain", ["the lighthouse key hangs by the stove"])
    await memory_service.sync_now()
    assert await found(memory_service, "lighthouse") == ["plain"]
    status = await memory_service.status()
    assert (status["files"], status["chunks"]) == (1, 1)


async def test_status_counts_one_users_rows_or_the_whole_index(
        memory_backend: MemoryBackend, memory_service: BackendMemory) -> None:
    """memory.status for a user counts that user's sessions and chunks, scope "user", without the
    whole index's shared cache; without a user it counts everyone's."""
    memory_backend.write("alice", "a1", ["the garden gate is green"])
    memory_backend.write("alice", "a2", ["the kitchen door is red"])
    memory_backend.write("bob", "b1", ["the attic window is round"])
    await memory_service.sync_now()
    mine, whole = await memory_service.status("alice"), await memory_service.status()
    assert ((mine["files"], mine["chunks"], mine["embedded"], mine["pending"], mine["scope"])
            == (2, 2, 2, 0, "user"))
    assert (whole["files"], whole["chunks"], whole["embedded"], whole["scope"]) == (3, 3, 3, "all")
    assert "cacheEntries" not in mine and whole["cacheEntries"] == 3
    assert "dbBytes" not in mine and whole["dbBytes"] > 0
    assert mine["retention"] == whole["retention"] == {"days": 0}
    assert mine["lastError"] is None and mine["syncCount"] == whole["syncCount"] >= 2
