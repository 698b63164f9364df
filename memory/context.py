"""One run's memory: what is on for it (:class:`RunMemory`) and what memory gives its prompt
(:class:`MemoryContext`), answered by one call (:func:`gather_context`).

The message is cut once (:data:`RECALL_QUERY_CHARS`), so recall, the facts section and the
episodes embed the same text and the service's query-vector cache embeds it once. A message
that asks about earlier conversations (:data:`RECALL_INTENT`) gets more episodes, weighted to
recency, and a time phrase in it filters the episodes by date. What is rendered into the
prompt, and how, is the gateway's (``gateway/chat/prompt.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, tzinfo
from typing import Protocol

import structlog

from memory.config import FactsMode, MemoryConfig
from memory.episodes.values import ScoredEpisode
from memory.errors import MemoryIndexError
from memory.facts.values import ScoredFact
from memory.retrieval.request import MAX_QUERY_CHARS, SearchHit, ShownHistory
from memory.retrieval.timephrases import find_time_window

__all__ = ["RECALL_INTENT", "RECALL_QUERY_CHARS", "ContextSources", "MemoryContext", "RunMemory",
           "gather_context"]

log = structlog.get_logger("memory.context")

# Recall searches with the start of the message: enough words to find related talk, and a
# bound on the work a huge paste can cause.
RECALL_QUERY_CHARS = 2000
RECALL_INTENT = re.compile(
    r"\b(remember when|do you remember|do you recall|what did (we|i) "
    r"(talk|speak|chat|discuss|say|decide)"
    r"|did i (tell|mention|say)|last time we|we (talked|spoke|chatted) about|have we "
    r"(talked|discussed|spoken)"
    r"|what were we (talking|discussing))\b",
    re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class RunMemory:
    """What memory does for one run, decided once when its session is known."""

    recall: bool = False        # excerpts of the user's other sessions go into the prompt
    facts: FactsMode = "off"    # "tool": remember/forget/search_memory; "block": a trailing block
    episodes: bool = False      # summaries of earlier conversations go into the prompt
    write_episodes: bool = False  # the run may lead to a new episode afterwards

    @property
    def any(self) -> bool:
        return self.recall or self.facts != "off" or self.episodes

    @classmethod
    def decide(cls, config: MemoryConfig | None, *, incognito: bool, recall: bool,
               chunk_recall: bool, tools: bool) -> RunMemory:
        """``config`` None or not ``enabled``: no memory. ``incognito``: the session's
        ``memory: false``, which turns every part off. ``recall``: ``chat.send``'s flag (recalled
        excerpts and episodes); ``chunk_recall``: ``chat.recall`` (excerpts only). ``tools``: the
        model takes tool calls (one that refused them is asked for the trailing block instead)."""
        if config is None or not config.enabled or incognito:
            return cls()
        facts: FactsMode = config.facts
        if facts == "tool" and not tools:
            facts = "block"
        return cls(
            recall=recall and chunk_recall,
            facts=facts,
            episodes=recall and config.episodes and config.episode_recall_k > 0,
            write_episodes=config.episodes,
        )


@dataclass(frozen=True, slots=True)
class MemoryContext:
    """What memory puts in one run's prompt, best first in each part."""

    chunks: tuple[SearchHit, ...] = ()
    facts: tuple[ScoredFact, ...] = ()
    episodes: tuple[ScoredEpisode, ...] = ()


class _FactsSource(Protocol):
    async def relevant(self, user: str, query: str, *, limit: int,
                       budget_tokens: int) -> list[ScoredFact]: ...


class _EpisodesSource(Protocol):
    async def search(self, user: str, query: str, *, limit: int,
                     window: tuple[int, int] | None = None, recency: float = 0.0,
                     half_life_days: float = 30.0) -> list[ScoredEpisode]: ...


class ContextSources(Protocol):
    """What :func:`gather_context` reads of a memory service (either backend's)."""

    @property
    def config(self) -> MemoryConfig: ...

    @property
    def facts(self) -> _FactsSource: ...

    @property
    def episodes(self) -> _EpisodesSource: ...

    async def recall(self, user: str, message: str, *, k: int,
                     exclude_session_key: str | None = None, now: datetime | None = None,
                     shown: ShownHistory | None = None) -> list[SearchHit]: ...


async def gather_context(memory: ContextSources, user: str, message: str, run: RunMemory, *, k: int,
                         shown: ShownHistory, tz: tzinfo) -> MemoryContext:
    """``Memory.context`` on either backend: the chunks (``k`` at most, of every session but
    what ``shown``'s window holds), facts and episodes of ``run`` for ``user``'s ``message``;
    each part that fails is logged and left empty (memory is a help, never a reason to fail
    the reply)."""
    config = memory.config
    query = message[:RECALL_QUERY_CHARS][:MAX_QUERY_CHARS]
    chunks: list[SearchHit] = []
    if run.recall:
        try:
            chunks = await memory.recall(user, query, k=k, shown=shown)
        except Exception as exc:
            log.warning("chat.recall_failed", error=str(exc))
    if chunks:
        log.info("chat.recalled", chunks=[h.chunk_id for h in chunks])
    picked: list[ScoredFact] = []
    if run.facts != "off":
        try:
            picked = await memory.facts.relevant(user, query, limit=config.facts_prompt_max,
                                                 budget_tokens=config.facts_prompt_budget_tokens)
        except MemoryIndexError as exc:
            log.warning("chat.facts_failed", error=str(exc))
    found: list[ScoredEpisode] = []
    if run.episodes:
        intent = RECALL_INTENT.search(query) is not None
        window = None
        if intent:
            phrase = find_time_window(query, datetime.now(tz))
            window = (phrase.start_ms, phrase.end_ms) if phrase is not None else None
        try:
            found = await memory.episodes.search(
                user, query, limit=config.episode_intent_k if intent else config.episode_recall_k,
                window=window, recency=0.5 if intent else 0.2)
        except MemoryIndexError as exc:
            log.warning("chat.episodes_failed", error=str(exc))
    return MemoryContext(tuple(chunks), tuple(picked), tuple(found))
