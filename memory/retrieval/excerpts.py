"""From a search's hits to the excerpts a prompt gets: the one rule both backends run.

Recall into a prompt (``Memory.recall``) is a hybrid search with the recency term followed by
these steps, each a pure function here except the neighbour read, which the backend supplies:

1. **relevance** (:func:`relevant`): the floor on the vector leg's cosine, adapted to the query
   (:func:`memory.retrieval.recall.for_prompt` documents the fixed part);
2. **the history window is not recalled again** (:func:`drop_shown`): with a
   :class:`~memory.retrieval.request.ShownHistory`, the search already left out the chunks the
   prompt's history window holds; a chunk that starts before the window and ends inside it
   loses its messages from the window on;
3. **merging and the token budget** (:func:`~memory.retrieval.recall.for_prompt`);
4. **neighbour widening** (:func:`~memory.retrieval.neighbours.widen`), after which step 2
   runs again (a neighbour may be a message of the window);
5. **no repeats** (:func:`without_repeats`): a sentence already in a better excerpt is left out
   of a later one (overlapping chunks of one session, a neighbour that another excerpt holds,
   the same words said in two sessions).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from memory.chunking import content_terms, iso_to_ms
from memory.config import MemoryConfig
from memory.retrieval.neighbours import FetchAround, messages, widen
from memory.retrieval.recall import for_prompt
from memory.retrieval.request import STOPWORDS, SearchHit, SearchResponse, ShownHistory

__all__ = ["drop_shown", "excerpts_for_prompt", "meaningful_words", "relevant", "without_repeats"]

# "who [ts]: " opening a rendered message (memory.chunking's prefix); group 1 is the time.
_PREFIX = re.compile(r"^[^\n\[\]]{1,80} \[(\d{4}-\d\d-\d\dT[^\]\n]*)\]: ")
_PREFIXES = re.compile(_PREFIX.pattern, re.MULTILINE)
# A sentence ends at . ! ? … (or a line break) followed by space; CJK full stops end one too.
_SENTENCE_END = re.compile(r"(?<=[.!?…。！？])\s+|\n+")


def relevant(hits: Sequence[SearchHit], query: str, *, vector_ran: bool, floor: float | None,
             config: MemoryConfig) -> list[SearchHit]:
    """The hits that clear the relevance floor. Without the vector leg or a floor, all of them.

    The fixed floor alone lets most of a small index through: a model's cosines between any
    two chats of one person sit in a narrow band above it. So the floor adapts to the query:

    * a hit whose messages share no word that carries meaning with ``query`` (words of three
      letters or more, or any CJK character, that are not function words; the ``who [ts]:``
      openings do not count) must clear the floor by ``recall_vector_only_margin``: a shared
      word is the evidence a cosine near the floor lacks. A query with no such word asks
      nothing of this;
    * a hit more than ``recall_relative_drop`` below the best hit's cosine is left out: it
      ranked only because the index is small.
    """
    if not vector_ran or floor is None:
        return list(hits)
    sims = [h.similarity for h in hits if h.similarity is not None]
    if not sims:
        return []
    bar = max(floor, max(sims) - config.recall_relative_drop)
    asked = meaningful_words(query)
    out: list[SearchHit] = []
    for hit in hits:
        if hit.similarity is None or hit.similarity < bar:
            continue
        if hit.similarity < floor + config.recall_vector_only_margin and asked \
                and not asked & meaningful_words(_PREFIXES.sub("", hit.content)):
            continue
        out.append(hit)
    return out


def meaningful_words(text: str) -> set[str]:
    """The case-folded words of ``text`` that carry meaning (:func:`content_terms` less the
    keyword leg's function words)."""
    return content_terms(text) - STOPWORDS


def _rendered_ts(message: str) -> int | None:
    opened = _PREFIX.match(message)
    return iso_to_ms(opened.group(1)) if opened else None


def drop_shown(hits: Sequence[SearchHit], shown: ShownHistory | None) -> list[SearchHit]:
    """``hits`` without the messages of ``shown``'s session timed at or after its window's
    start (they are in the prompt's history already); a hit left with nothing is dropped."""
    since = iso_to_ms(shown.since_ts) if shown is not None else None
    if shown is None or since is None:
        return list(hits)
    out: list[SearchHit] = []
    for hit in hits:
        if hit.session_key != shown.session_key:
            out.append(hit)
            continue
        found = messages(hit.content)
        if found is None:  # not split into messages: by its times, whole or not at all
            start = iso_to_ms(hit.start_ts)
            if start is not None and start < since:
                out.append(hit)
            continue
        kept = [m for m in found if (ts := _rendered_ts(m)) is None or ts < since]
        if not kept:
            continue
        if len(kept) == len(found):
            out.append(hit)
            continue
        # The window is the session's newest messages, so what goes is the hit's tail. Its line
        # range shrinks exactly when the chunk held one message per line of its span.
        exact = len(found) == hit.line_end - hit.line_start + 1
        line_end = hit.line_start + len(kept) - 1 if exact else hit.line_end
        stamps = [opened.group(1) for m in kept if (opened := _PREFIX.match(m)) is not None]
        out.append(replace(hit, content="\n".join(kept), line_end=line_end,
                           end_ts=max(stamps) if stamps else hit.end_ts))
    return out


def _sentences(text: str) -> list[str]:
    return [s for s in _SENTENCE_END.split(text) if s.strip()]


def _key(sentence: str) -> str:
    return " ".join(sentence.casefold().split())


def without_repeats(hits: Sequence[SearchHit]) -> list[SearchHit]:
    """``hits`` in order, each without the sentences an earlier one already holds (compared
    case- and space-insensitively, a message's ``who [ts]:`` opening aside); a message left with
    no sentence goes, and an excerpt left with no message."""
    seen: set[str] = set()
    out: list[SearchHit] = []
    for hit in hits:
        parts = messages(hit.content) or [hit.content]
        kept_parts: list[str] = []
        changed = False
        for part in parts:
            opened = _PREFIX.match(part)
            prefix, body = (part[:opened.end()], part[opened.end():]) if opened else ("", part)
            sentences = _sentences(body)
            fresh = []
            for sentence in sentences:
                key = _key(sentence)
                if key not in seen:
                    seen.add(key)
                    fresh.append(sentence.strip())
            if len(fresh) == len(sentences):
                kept_parts.append(part)
                continue
            changed = True
            if fresh:
                kept_parts.append(prefix + " ".join(fresh))
        if not kept_parts:
            continue
        out.append(replace(hit, content="\n".join(kept_parts)) if changed else hit)
    return out


async def excerpts_for_prompt(response: SearchResponse, query: str, config: MemoryConfig, *,
                              floor: float | None, around: FetchAround,
                              shown: ShownHistory | None = None) -> list[SearchHit]:
    """Steps 1–5 of the module docstring over ``response``, the hybrid search for ``query``."""
    hits = relevant(response.results, query, vector_ran=response.mode != "keyword", floor=floor, config=config)
    placed = for_prompt(drop_shown(hits, shown), vector_ran=False, floor=None,
                        budget_tokens=config.recall_budget_tokens)
    widened = await widen(placed, config, around)
    return without_repeats(drop_shown(widened, shown))
