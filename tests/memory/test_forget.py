"""Forgetting on a real index, on both backends: memory.forget by session and by time, a
recorded range against re-chunking, what the model saved from a forgotten conversation, and
the retention sweep."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from memory import EpisodeDraft
from memory.chunking import iso_to_ms
from memory.forget_range import ForgetRange
from tests.memory.conftest import (
    BASE_TIME,
    BackendMemory,
    FakeEmbedder,
    MemoryBackend,
    name_of,
    quiet_config,
    session_key,
    ts,
)

DAY = 24 * 60
# One message a chunk: a range forgets whole messages.
ONE_EACH = {"chunk_tokens": 16, "overlap_tokens": 0}


def ms(minute: float) -> int:
    value = iso_to_ms(ts(minute))
    assert value is not None
    return value


def draft(name: str, text: str, *, user: str = "alice") -> EpisodeDraft:
    return EpisodeDraft(user, session_key(name), text, name, datetime.now(UTC), ms(0))


async def found(svc: BackendMemory, query: str, user: str = "alice") -> list[str]:
    """The names of the sessions a keyword search finds, best first."""
    return [name_of(h.session_key) for h in (await svc.search(user, query, mode="keyword")).results]


async def test_forgetting_a_session_removes_its_chunks_and_no_other(
        memory_backend: MemoryBackend, memory_service: BackendMemory) -> None:
    """memory.forget naming a session removes that session's chunks at once and leaves
    the others."""
    memory_backend.write("alice", "garden", ["the garden gate is green"])
    memory_backend.write("alice", "kitchen", ["the kitchen door is red"])
    await memory_service.sync_now()
    removed = await memory_service.forget(ForgetRange("alice", session_key("garden")), record=False)
    assert removed == {"chunks": 1, "facts": 0, "episodes": 0}
    assert await found(memory_service, "garden gate") == []
    assert await found(memory_service, "kitchen door") == ["kitchen"]
    assert (await memory_service.status())["chunks"] == 1


async def test_a_time_range_forgets_only_the_chunks_it_overlaps(
        memory_backend: MemoryBackend) -> None:
    """A range [after, before) removes the chunks whose messages fall in it; those before and
    after it stay searchable."""
    memory_backend.write("alice", "day", ["breakfast was porridge", "lunch was ramen",
                                          "tea was oolong", "dinner was risotto"])
    async with memory_backend.opened(quiet_config(**ONE_EACH), FakeEmbedder()) as svc:
        assert (await svc.status())["chunks"] == 4
        removed = await svc.forget(ForgetRange("alice", session_key("day"), ms(1), ms(3)),
                                   record=False)
        left = {word: await found(svc, word) for word in ("porridge", "ramen", "oolong", "risotto")}
    assert removed == {"chunks": 2, "facts": 0, "episodes": 0}
    assert left == {"porridge": ["day"], "ramen": [], "oolong": [], "risotto": ["day"]}


async def test_a_recorded_range_stays_forgotten_when_sessions_are_chunked_again(
        memory_backend: MemoryBackend) -> None:
    """With ``record`` the forgotten range is kept, so a full re-index of the sessions (which
    still hold the messages) does not bring the chunks back; without it, it does."""
    memory_backend.write("alice", "garden", ["the garden gate is green"])
    memory_backend.write("alice", "kitchen", ["the kitchen door is red"])
    async with memory_backend.opened(quiet_config(), FakeEmbedder()) as svc:
        await svc.forget(ForgetRange("alice", session_key("garden")), record=True)
        await svc.forget(ForgetRange("alice", session_key("kitchen")), record=False)
        assert await found(svc, "kitchen door") == []
        await svc.sync_now(full=True)
        garden, kitchen = await found(svc, "garden gate"), await found(svc, "kitchen door")
        status = await svc.status()
    assert garden == [] and kitchen == ["kitchen"]
    assert (status["chunks"], status["pending"]) == (1, 0)


async def test_forgetting_a_conversation_takes_what_the_model_saved_from_it(
        memory_backend: MemoryBackend) -> None:
    """The facts the model saved from the forgotten conversation and its episodes go with its
    chunks; a fact the user stated, and another conversation's, stay."""
    memory_backend.write("alice", "chat", ["I started playing the cello"])
    async with memory_backend.opened(quiet_config(), FakeEmbedder()) as svc:
        await svc.facts.add("alice", "Plays the cello", source="model",
                            session_key=session_key("chat"))
        await svc.facts.add("alice", "Lives in Porto", source="user",
                            session_key=session_key("chat"))
        await svc.facts.add("alice", "Has a dog called Rex", source="model",
                            session_key=session_key("other"))
        await svc.episodes.write(draft("chat", "Talked about learning the cello."), None)
        await svc.episodes.write(draft("other", "Talked about the dog Rex."), None)
        removed = await svc.forget(ForgetRange("alice", session_key("chat")), record=False)
        facts = sorted(f.text for f in (await svc.facts.page("alice", limit=10)).facts)
        episodes, _ = await svc.episodes.page("alice", limit=10, before=None)
    assert removed == {"chunks": 1, "facts": 1, "episodes": 1}
    assert facts == ["Has a dog called Rex", "Lives in Porto"]
    assert [e.text for e in episodes] == ["Talked about the dog Rex."]


async def test_forgetting_is_one_users(memory_backend: MemoryBackend,
                                       memory_service: BackendMemory) -> None:
    """memory.forget of everything a user said leaves another user's chunks, facts and episodes."""
    memory_backend.write("alice", "a1", ["the pelican nests by the pier"])
    memory_backend.write("bob", "b1", ["the pelican nests by the pier"])
    await memory_service.sync_now()
    await memory_service.facts.add("bob", "Watches pelicans", source="model",
                                   session_key=session_key("b1"))
    await memory_service.episodes.write(draft("b1", "Talked about pelicans.", user="bob"), None)
    removed = await memory_service.forget(ForgetRange("alice"), record=False)
    assert removed == {"chunks": 1, "facts": 0, "episodes": 0}
    assert await found(memory_service, "pelican") == []
    assert await found(memory_service, "pelican", user="bob") == ["b1"]
    assert ([f.text for f in (await memory_service.facts.page("bob", limit=10)).facts]
            == ["Watches pelicans"])
    assert len((await memory_service.episodes.page("bob", limit=10, before=None))[0]) == 1


async def test_retention_off_keeps_everything_and_a_sweep_removes_only_what_is_older(
        memory_backend: MemoryBackend) -> None:
    """retention_days = 0 sweeps nothing; with 30 days, a sweep removes the chunks whose newest
    message is older than that and keeps the recent ones."""
    memory_backend.write("alice", "old", ["an old conversation about herons"],
                         start_minute=-40 * DAY)
    memory_backend.write("alice", "new", ["a new conversation about herons"])
    a_day_later = ms(DAY)
    async with memory_backend.opened(quiet_config(), FakeEmbedder()) as svc:
        assert await svc.sweep_retention(a_day_later) == {"chunks": 0, "facts": 0, "episodes": 0}
    async with memory_backend.opened(quiet_config(retention_days=30), FakeEmbedder()) as svc:
        swept = await svc.sweep_retention(a_day_later)
        herons = await found(svc, "herons")
        status = await svc.status()
    assert swept == {"chunks": 1, "facts": 0, "episodes": 0}
    assert herons == ["new"]
    assert status["chunks"] == 1 and status["retention"]["days"] == 30


async def test_a_retention_sweep_also_removes_old_facts_and_episodes(
        memory_backend: MemoryBackend) -> None:
    """Facts and episodes not touched within retention_days go in the same sweep as the chunks."""
    memory_backend.write("alice", "k1", ["an old conversation"])
    async with memory_backend.opened(quiet_config(), FakeEmbedder()):
        pass  # indexed while retention is off
    async with memory_backend.opened(quiet_config(retention_days=1), FakeEmbedder()) as svc:
        await svc.facts.add("alice", "An old fact", source="user")
        await svc.episodes.write(draft("k1", "An old talk."), None)
        # Three days after both the messages and the rows written now: all past one day.
        later = max(int(time.time() * 1000), int(BASE_TIME.timestamp() * 1000)) + 3 * 86_400_000
        swept = await svc.sweep_retention(later)
        facts = (await svc.facts.page("alice", limit=10, include_inactive=True)).facts
        episodes, _ = await svc.episodes.page("alice", limit=10, before=None)
    assert swept == {"chunks": 1, "facts": 1, "episodes": 1}
    assert facts == [] and episodes == []


async def test_a_sync_never_indexes_what_retention_has_expired(
        memory_backend: MemoryBackend) -> None:
    """Messages older than retention_days are not indexed by a sync, nor by a full re-index."""
    now = (datetime.now(UTC) - BASE_TIME).total_seconds() / 60  # ``ts`` counts minutes
                                                                # from BASE_TIME
    memory_backend.write("alice", "old", ["an old conversation about herons"],
                         start_minute=now - 40 * DAY)
    memory_backend.write("alice", "new", ["a new conversation about herons"],
                         start_minute=now - DAY)
    async with memory_backend.opened(quiet_config(retention_days=30), FakeEmbedder()) as svc:
        indexed = await found(svc, "herons")
        await svc.sync_now(full=True)
        reindexed = await found(svc, "herons")
    assert indexed == ["new"] and reindexed == ["new"]
