"""``PgMemory`` is the gateway's :class:`memory.Memory` on PostgreSQL: one context call with
MemoryService's rules, its facts and episodes services, status with the gateway's keys,
retention, and episode jobs claimed by one node at a time."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.methods.memory import StatusReply
from memory import EpisodeDraft, ForgetRange, Memory, RunMemory
from memory.pg.service import PgMemory
from memory.retrieval.request import ShownHistory
from tests.memory.conftest import FakeEmbedder, quiet_config, session_key
from tests.memory.pg.conftest import add_session

# The prompt's history window holds the whole current session: none of it is recalled.
WHOLE = "1970-01-01T00:00:00.000Z"


@pytest.fixture
async def node(pg_index: str, tmp_path: Path) -> AsyncIterator[PgMemory]:
    service = await PgMemory.open(pg_index, quiet_config(), FakeEmbedder(), data_dir=tmp_path)
    try:
        yield service
    finally:
        await service.close()


def draft(key: str, text: str, theme: str) -> EpisodeDraft:
    return EpisodeDraft("alice", key, text, theme, datetime.now(UTC), int(time.time() * 1000))


async def test_one_context_call_gives_chunks_facts_and_episodes(pg_index: str,
                                                                node: PgMemory) -> None:
    """A run's context on PostgreSQL: chunks recalled from the user's other sessions (never the
    current one), the related fact and the matching episode, each by memory's own rules."""
    memory: Memory = node  # mypy: PgMemory is the Protocol the gateway depends on
    add_session(pg_index, "alice", "old", ["my favourite language is rust", "rust it is then"])
    add_session(pg_index, "alice", "now", ["which language is my favourite"])
    await memory.sync_now()
    await memory.facts.add("alice", "The user's favourite language is Rust", source="user")
    await memory.facts.add("alice", "The user has two cats", source="user")
    await memory.episodes.write(draft(session_key("old"),
                                      "Talked about Rust, the favourite language.",
                                      "rust language"), None)
    run = RunMemory(recall=True, facts="block", episodes=True)
    context = await memory.context("alice", "which language is my favourite", run, k=5,
                                   shown=ShownHistory(session_key("now"), WHOLE), tz=UTC)
    assert {h.session_key for h in context.chunks} == {session_key("old")}
    assert context.facts[0].fact.text == "The user's favourite language is Rust"
    assert [e.episode.theme for e in context.episodes][:1] == ["rust language"]
    off = await memory.context("alice", "which language is my favourite", RunMemory(), k=5,
                               shown=ShownHistory(session_key("now"), WHOLE), tz=UTC)
    assert (off.chunks, off.facts, off.episodes) == ((), (), ())


async def test_facts_dedup_and_forget_derived(node: PgMemory) -> None:
    """Facts on PostgreSQL keep Facts' rules: the same text is unchanged, a correction is a new
    version, and forgetting a conversation removes what the model saved from it."""
    first = await node.facts.add("alice", "Lives in Lisbon", source="user")
    again = await node.facts.add("alice", "Lives  in Lisbon", source="user")
    assert (first.action, again.action, again.fact.id) == ("added", "unchanged", first.fact.id)
    fixed = await node.facts.update("alice", first.fact.id, "Lives in Porto")
    assert [f.text for f in await node.facts.history("alice", fixed.fact.id)] == ["Lives in Lisbon",
                                                                                  "Lives in Porto"]
    key = session_key("chat")
    await node.facts.add("alice", "Plays the cello", source="model", session_key=key)
    removed = await node.forget(ForgetRange("alice", session_key=key), record=False)
    assert removed == {"chunks": 0, "facts": 1, "episodes": 0}
    assert [f.text for f in (await node.facts.page("alice", limit=10)).facts] == ["Lives in Porto"]


async def test_status_has_the_gateways_keys(pg_index: str, node: PgMemory) -> None:
    """memory.status on PostgreSQL answers every key of the gateway's StatusReply with
    PostgreSQL's values, and no key the reply does not declare."""
    add_session(pg_index, "alice", "k1", ["the garden gate is green"])
    await node.sync_now()
    whole, mine = await node.status(), await node.status("alice")
    declared = set(StatusReply.__annotations__)
    # the whole index's
    assert set(mine) == declared - {"cacheEntries", "skippedFiles", "dbBytes", "dbPath"}
    assert set(mine) < set(whole) <= declared
    assert (whole["files"], whole["chunks"], whole["pending"], whole["syncCount"]) == (1, 1, 0, 1)
    assert (whole["vectorBackend"]["available"]
            and whole["vectorBackend"]["reason"].startswith("pgvector"))
    assert whole["dbBytes"] > 0 and "dbPath" not in whole


async def test_retention_sweeps_chunks_facts_and_episodes(pg_index: str, node: PgMemory) -> None:
    """sweep_retention removes what is older than retention_days, and nothing when it is 0."""
    add_session(pg_index, "alice", "k1", ["an old conversation"])
    await node.sync_now()
    await node.facts.add("alice", "An old fact", source="user")
    await node.episodes.write(draft(session_key("k1"), "An old talk.", "old"), None)
    assert await node.sweep_retention() == {"chunks": 0, "facts": 0, "episodes": 0}
    node.config = quiet_config(retention_days=1)
    later = int(time.time() * 1000) + 3 * 86_400_000
    assert await node.sweep_retention(later) == {"chunks": 1, "facts": 1, "episodes": 1}


async def test_an_episode_job_is_claimed_by_one_node(pg_index: str, node: PgMemory,
                                                     tmp_path: Path) -> None:
    """A due job handed to one node is not handed to another until it is done or failed."""
    other = await PgMemory.open(pg_index, quiet_config(), None, data_dir=tmp_path)
    try:
        await node.episodes.enqueue("alice", session_key("k1"))
        jobs = await node.episodes.due()
        assert [j.session_key for j in jobs] == [session_key("k1")]
        assert await other.episodes.due() == [] and await node.episodes.due() == []
        assert await node.episodes.job_failed(jobs[0], "model down", retry_s=0,
                                              max_attempts=3) is False
        assert [j.attempts for j in await other.episodes.due()] == [1]
    finally:
        await other.close()


async def test_no_embedder_searches_keywords(pg_index: str, tmp_path: Path) -> None:
    """Without an embedder, recall and facts still answer (keyword only)."""
    node = await PgMemory.open(pg_index, quiet_config(), None, data_dir=tmp_path,
                               embedder_reason="off")
    try:
        add_session(pg_index, "alice", "k1", ["the garden gate is green"])
        await node.sync_now()
        hits = await node.recall("alice", "garden gate", k=3)
        assert [h.session_key for h in hits] == [session_key("k1")]
        await node.facts.add("alice", "The gate is green", source="user")
        assert len(await node.facts.relevant("alice", "gate", limit=3, budget_tokens=100)) == 1
        with pytest.raises(AssertionError):
            await node.embed_query("x")
    finally:
        await node.close()
