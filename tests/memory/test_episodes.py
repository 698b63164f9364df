"""Episodes on a real index, on both backends: written and merged, searched by words, meaning and
time, paged, scoped per user, and the queue of summaries still to write."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from memory import EpisodeDraft
from memory.chunking import iso_to_ms
from tests.memory.conftest import (
    BackendMemory,
    FakeEmbedder,
    MemoryBackend,
    quiet_config,
    session_key,
    ts,
)

TALKS = {"garden": ("We planned the vegetable garden and where the tomato beds go.",
                    "garden planning"),
         "taxes": ("We went through the tax return and when its deadline is.", "tax return"),
         "cello": ("We talked about practising the cello before the concert.", "cello practice")}


def ms(minute: float) -> int:
    value = iso_to_ms(ts(minute))
    assert value is not None
    return value


async def draft(svc: BackendMemory, name: str, text: str, theme: str, *, user: str = "alice",
                covered_minute: float = 0) -> EpisodeDraft:
    """An episode of the session called ``name``, written now, with the service's vector of
    its text."""
    return EpisodeDraft(user, session_key(name), text, theme, datetime.now(UTC), ms(covered_minute),
                        await svc.episodes.embed(text))


async def test_an_episode_is_found_by_the_words_and_meaning_of_a_question(
        memory_backend: MemoryBackend) -> None:
    """An episode search ranks the episode whose summary and theme answer the question first."""
    async with memory_backend.opened(quiet_config(), FakeEmbedder()) as svc:
        for name, (text, theme) in TALKS.items():
            await svc.episodes.write(await draft(svc, name, text, theme), None)
        found = await svc.episodes.search("alice", "when is the tax return deadline", limit=3)
    assert [s.episode.theme for s in found][0] == "tax return"
    assert len(found) == 3 and found[0].score > found[1].score


async def test_a_merge_updates_the_episode_in_place(memory_backend: MemoryBackend) -> None:
    """Writing into an existing episode keeps its id, takes the new summary, counts the merge and
    covers up to the newer conversation; the user still has one episode."""
    async with memory_backend.opened(quiet_config(), FakeEmbedder()) as svc:
        first = await svc.episodes.write(await draft(svc, "garden", *TALKS["garden"]), None)
        merged = await svc.episodes.write(
            await draft(svc, "garden", "We planned the garden and chose the seeds.",
                        "garden planning", covered_minute=90), first.id)
        episodes, more = await svc.episodes.page("alice", limit=10, before=None)
        last = await svc.episodes.last_of_session("alice", session_key("garden"))
    assert merged.id == first.id and merged.merges == 1
    assert (merged.text == "We planned the garden and chose the seeds."
            and merged.covered_ms == ms(90))
    assert [e.id for e in episodes] == [first.id] and more is None
    assert last == merged


async def test_pages_walk_every_episode_once_newest_first(memory_backend: MemoryBackend) -> None:
    """Pages of two, following the cursor, list five episodes newest first, each exactly once."""
    async with memory_backend.opened(quiet_config(), None) as svc:
        written = [await svc.episodes.write(await draft(svc, f"s{i}", f"Talk number {i}.",
                                                        f"theme {i}"), None)
                   for i in range(5)]
        seen: list[int] = []
        before = None
        while True:
            page, before = await svc.episodes.page("alice", limit=2, before=before)
            seen += [e.id for e in page]
            if before is None:
                break
    assert seen == [e.id for e in reversed(written)]


async def test_episodes_are_one_users(memory_backend: MemoryBackend) -> None:
    """Another user's episodes are neither searched, paged, counted nor the last of a session."""
    async with memory_backend.opened(quiet_config(), FakeEmbedder()) as svc:
        await svc.episodes.write(await draft(svc, "taxes", *TALKS["taxes"], user="bob"), None)
        since = int(time.time() * 1000) - 60_000
        alice = (await svc.episodes.search("alice", "tax return deadline", limit=3),
                 await svc.episodes.page("alice", limit=10, before=None),
                 await svc.episodes.count_since("alice", since),
                 await svc.episodes.last_of_session("alice", session_key("taxes")))
        bob = await svc.episodes.count_since("bob", since)
    assert alice == ([], ([], None), 0, None)
    assert bob == 1


async def test_a_time_window_keeps_the_episodes_whose_conversation_reached_into_it(
        memory_backend: MemoryBackend) -> None:
    """A search with a window (a time phrase's) returns only episodes whose conversation ran into
    it, however well the others match."""
    async with memory_backend.opened(quiet_config(), FakeEmbedder()) as svc:
        await svc.episodes.write(await draft(svc, "early", "We talked about the cello.", "cello",
                                             covered_minute=0), None)
        await svc.episodes.write(await draft(svc, "late",
                                             "We talked about the cello concert again.", "cello",
                                             covered_minute=600), None)
        found = await svc.episodes.search("alice", "cello", limit=5,
                                          window=(ms(300), ms(24 * 60 * 3650)))
        everything = await svc.episodes.search("alice", "cello", limit=5)
    assert [s.episode.session_key for s in found] == [session_key("late")]
    assert len(everything) == 2


async def test_the_queue_keeps_one_job_a_session_retries_and_gives_up(
        memory_backend: MemoryBackend) -> None:
    """Queueing a session twice makes one job; a failed attempt is due again with its count,
    the last allowed one marks it failed, a new turn revives it and a finished job is gone."""
    key = session_key("chat")
    async with memory_backend.opened(quiet_config(), None) as svc:
        await svc.episodes.enqueue("alice", key)
        await svc.episodes.enqueue("alice", key)  # a later turn joins the pending job
        jobs = await svc.episodes.due()
        assert [(j.user, j.session_key, j.attempts) for j in jobs] == [("alice", key, 0)]
        assert await svc.episodes.job_failed(jobs[0], "model down", retry_s=0,
                                             max_attempts=2) is False
        again = await svc.episodes.due()
        assert [j.attempts for j in again] == [1]
        assert await svc.episodes.job_failed(again[0], "model down", retry_s=0,
                                             max_attempts=2) is True
        assert await svc.episodes.due() == []
        assert await svc.episodes.queue_state() == {"pending": 0, "failed": 1}
        await svc.episodes.enqueue("alice", key)
        revived = await svc.episodes.due()
        assert [j.attempts for j in revived] == [0]
        await svc.episodes.job_done(revived[0].id)
        assert await svc.episodes.queue_state() == {"pending": 0, "failed": 0}
