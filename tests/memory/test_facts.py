"""Remembered facts on a real index: two-tier dedup, corrections with history, scoping,
prompt picks."""

from __future__ import annotations

import pytest

from memory.errors import FactNotFound, InvalidFact
from memory.facts import normalise
from tests.memory.conftest import FakeEmbedder, MemoryBackend, quiet_config


async def test_exact_duplicate_is_one_fact(memory_backend: MemoryBackend) -> None:
    """The same text up to case, spacing and end punctuation is recognised and not stored twice."""
    async with memory_backend.opened(quiet_config(), None) as svc:
        first = await svc.facts.add("alice", "My cat is called Luna.", source="model")
        again = await svc.facts.add("alice", "  my cat is CALLED luna ", source="model")
        assert first.action == "added" and again.action == "unchanged"
        assert again.fact.id == first.fact.id
        page = await svc.facts.page("alice", limit=10)
        assert [f.text for f in page.facts] == ["My cat is called Luna."]


async def test_near_duplicate_updates_the_existing_fact(memory_backend: MemoryBackend) -> None:
    """A new fact whose vector is within the threshold of an active one becomes its next version."""
    emb = FakeEmbedder()
    async with memory_backend.opened(quiet_config(facts_dedup_threshold=0.8), emb) as svc:
        first = await svc.facts.add("alice", "I live in Berlin with my partner Sam", source="model")
        merged = await svc.facts.add("alice", "I live in Berlin with my partner Sam now",
                                     source="model")
        other = await svc.facts.add("alice", "My favourite food is ramen", source="model")
        assert merged.action == "updated" and merged.previous_id == first.fact.id
        assert merged.similarity is not None and merged.similarity >= 0.8
        assert other.action == "added"
        active = (await svc.facts.page("alice", limit=10)).facts
        assert sorted(f.text for f in active) == ["I live in Berlin with my partner Sam now",
                                                  "My favourite food is ramen"]


async def test_correction_replaces_and_keeps_history(memory_backend: MemoryBackend) -> None:
    """``replaces`` retires the old fact; its version stays, inactive, in the fact's history."""
    async with memory_backend.opened(quiet_config(), FakeEmbedder()) as svc:
        old = await svc.facts.add("alice", "Luna is 3 years old", source="model")
        new = await svc.facts.add("alice", "Luna turned 4", source="model", replaces=old.fact.id)
        assert new.action == "replaced" and new.fact.previous_id == old.fact.id
        history = await svc.facts.history("alice", new.fact.id)
        assert [(f.text, f.active) for f in history] == [("Luna is 3 years old", False),
                                                         ("Luna turned 4", True)]
        everything = await svc.facts.page("alice", limit=10, include_inactive=True)
        assert len(everything.facts) == 2
        with pytest.raises(InvalidFact) as info:
            await svc.facts.add("alice", "Luna is 5", source="model", replaces=old.fact.id)
        assert info.value.field == "replaces"


async def test_delete_removes_every_version(memory_backend: MemoryBackend) -> None:
    """Deleting a fact removes it and its earlier versions; the id is then unknown."""
    async with memory_backend.opened(quiet_config(), None) as svc:
        old = await svc.facts.add("alice", "I work at Acme", source="user")
        new = await svc.facts.update("alice", old.fact.id, "I work at Initech")
        await svc.facts.delete("alice", new.fact.id)
        assert (await svc.facts.page("alice", limit=10, include_inactive=True)).facts == []
        with pytest.raises(FactNotFound):
            await svc.facts.get("alice", old.fact.id)


async def test_facts_are_scoped_per_user(memory_backend: MemoryBackend) -> None:
    """One user's fact is invisible to another: not listed, not deletable, not a duplicate."""
    async with memory_backend.opened(quiet_config(), None) as svc:
        mine = await svc.facts.add("alice", "I am vegetarian", source="user")
        theirs = await svc.facts.add("bob", "I am vegetarian", source="user")
        assert theirs.action == "added" and theirs.fact.id != mine.fact.id
        with pytest.raises(FactNotFound):
            await svc.facts.delete("bob", mine.fact.id)
        assert [f.id for f in (await svc.facts.page("bob", limit=10)).facts] == [theirs.fact.id]


async def test_bad_text_is_refused_and_nothing_saved(memory_backend: MemoryBackend) -> None:
    """Empty and over-long facts are refused naming the field; the store stays empty."""
    async with memory_backend.opened(quiet_config(facts_max_chars=20), None) as svc:
        for text in ("   ", "x" * 21):
            with pytest.raises(InvalidFact) as info:
                await svc.facts.add("alice", text, source="user")
            assert info.value.field == "text"
        assert (await svc.facts.page("alice", limit=10)).facts == []


async def test_pagination_walks_every_fact_once(memory_backend: MemoryBackend) -> None:
    """Pages of two, following ``next``, list five facts newest first, each exactly once."""
    async with memory_backend.opened(quiet_config(), None) as svc:
        for i in range(5):
            await svc.facts.add("alice", f"fact number {i}", source="user")
        seen: list[str] = []
        before = None
        while True:
            page = await svc.facts.page("alice", limit=2, before=before)
            seen += [f.text for f in page.facts]
            if page.next is None:
                break
            before = page.next
        assert seen == [f"fact number {i}" for i in (4, 3, 2, 1, 0)]


async def test_relevant_puts_related_facts_first_within_the_limit(
        memory_backend: MemoryBackend) -> None:
    """The prompt pick ranks facts sharing the message's words first and stops at the limit."""
    async with memory_backend.opened(quiet_config(), FakeEmbedder()) as svc:
        for text in ("My dog Rex loves the beach", "I am allergic to peanuts", "I play the cello",
                     "My sister lives in Lisbon"):
            await svc.facts.add("alice", text, source="user")
        picked = await svc.facts.relevant("alice", "what snack without peanuts?", limit=2,
                                          budget_tokens=300)
        assert len(picked) == 2
        assert picked[0].fact.text == "I am allergic to peanuts"


async def test_facts_survive_a_restart_and_a_full_reindex(memory_backend: MemoryBackend) -> None:
    """Facts are not derived from transcripts: reopening and a full reindex keep them."""
    async with memory_backend.opened(quiet_config(), None) as svc:
        await svc.facts.add("alice", "I prefer tea over coffee", source="user")
    async with memory_backend.opened(quiet_config(), None) as svc:
        await svc.sync_now(full=True)
        assert ([f.text for f in (await svc.facts.page("alice", limit=10)).facts]
                == ["I prefer tea over coffee"])


def test_normalise_folds_case_space_and_end_punctuation() -> None:
    """Exact dedup compares case-folded, space-collapsed text without trailing full stops."""
    assert normalise("  Ich  wohne in KÖLN. ") == normalise("ich wohne in köln")
