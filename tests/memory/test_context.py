"""RunMemory: what memory does for one chat run, decided once from the settings, the session's
incognito flag, chat.send's recall flag and whether the model takes tool calls."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

from memory import EpisodeDraft, MemoryConfig, RunMemory
from memory.retrieval.request import ShownHistory
from tests.memory.conftest import FakeEmbedder, MemoryBackend, quiet_config, session_key

# The prompt's history window holds the whole current session: none of it is recalled.
WHOLE = "1970-01-01T00:00:00.000Z"

DEFAULTS = MemoryConfig()


def decide(config: MemoryConfig | None = DEFAULTS, *, incognito: bool = False, recall: bool = True,
           chunk_recall: bool = True, tools: bool = True) -> RunMemory:
    return RunMemory.decide(config, incognito=incognito, recall=recall, chunk_recall=chunk_recall,
                            tools=tools)


def test_a_plain_run_uses_every_part() -> None:
    """With the defaults a run recalls chunks and episodes, offers the fact tools and may write
    an episode."""
    assert decide() == RunMemory(recall=True, facts="tool", episodes=True, write_episodes=True)


def test_no_service_or_an_incognito_session_uses_none() -> None:
    """Without a memory service, or in a session with memory:false, nothing of memory is on."""
    assert decide(None) == RunMemory() and not decide(None).any
    assert decide(incognito=True) == RunMemory()


def test_recall_false_keeps_the_facts_and_the_episode_writer() -> None:
    """chat.send {recall:false} drops recalled chunks and episodes from the prompt, nothing else;
    chat.recall = false drops only the chunks."""
    assert decide(recall=False) == RunMemory(recall=False, facts="tool", episodes=False,
                                             write_episodes=True)
    assert decide(chunk_recall=False) == RunMemory(recall=False, facts="tool", episodes=True,
                                                   write_episodes=True)


def test_a_model_without_tools_gets_the_block_and_settings_turn_parts_off() -> None:
    """A model that refused tools is asked for the trailing block; facts "off", episodes off or
    episode_recall_k 0 turn those parts off."""
    assert decide(tools=False).facts == "block"
    config = DEFAULTS
    assert decide(dataclasses.replace(config, facts="off")).facts == "off"
    assert decide(dataclasses.replace(config, facts="block")).facts == "block"
    off = decide(dataclasses.replace(config, episodes=False))
    assert not off.episodes and not off.write_episodes
    assert not decide(dataclasses.replace(config, episode_recall_k=0)).episodes


async def test_one_context_call_embeds_the_message_once(memory_backend: MemoryBackend) -> None:
    """MemoryService.context recalls chunks, facts and episodes for a message with one query
    embedding, and each part answers from the user's rows."""
    memory_backend.write("alice", "garden", ["tomatoes in the garden need water daily", "noted"])
    embedder = FakeEmbedder()
    async with memory_backend.opened(quiet_config(), embedder) as svc:
        await svc.sync_now()
        await svc.facts.add("alice", "My garden has twelve tomato plants", source="user")
        summary = "The user asked how often to water the garden tomatoes"
        await svc.episodes.write(EpisodeDraft("alice", session_key("garden"), summary,
                                              "garden care", datetime.now(UTC), 0,
                                              await svc.episodes.embed(summary)), None)
        message = "how often should I water my garden tomatoes?"
        before = len(embedder.calls)
        context = await svc.context("alice", message, decide(), k=3,
                                    shown=ShownHistory(session_key("other"), WHOLE), tz=UTC)
    assert [c for c in embedder.calls[before:] if message in c] == [[message]]
    assert context.chunks and context.facts and context.episodes
    assert context.facts[0].fact.text == "My garden has twelve tomato plants"
    assert context.episodes[0].episode.text == summary
