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

from memory.chunking import CONTINUED, content_terms, iso_to_ms
from memory.config import MemoryConfig
from memory.retrieval.neighbours import OPENS, FetchAround, message_ts, messages, widen
from memory.retrieval.recall import above_floor, for_prompt
from memory.retrieval.request import STOPWORDS, SearchHit, SearchResponse, ShownHistory

__all__ = ["drop_shown", "excerpts_for_prompt", "meaningful_words", "relevant", "without_repeats"]

# A sentence ends at . ! ? … (or a line break) followed by space; CJK full stops end one too.
_SENTENCE_END = re.compile(r"(?<=[.!?…。！？])\s+|\n+")
# A repeated sentence shorter than this many words stays: "Yes." twice is an answer each time.
REPEAT_MIN_WORDS = 3


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
    best = max((h.similarity for h in hits if h.similarity is not None), default=floor)
    asked = meaningful_words(query)
    return [hit for hit in above_floor(hits, vector_ran=True,
                                       floor=max(floor, best - config.recall_relative_drop))
            if hit.similarity is None or hit.similarity >= floor + config.recall_vector_only_margin
            or not asked or asked & meaningful_words(OPENS.sub("", hit.content))]


def meaningful_words(text: str) -> set[str]:
    """The case-folded words of ``text`` that carry meaning (:func:`content_terms` less the
    keyword leg's function words)."""
    return content_terms(text) - STOPWORDS


def _rendered_ts(message: str) -> int | None:
    return iso_to_ms(message_ts(message))


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
        # The window is the session's newest messages, so what goes is the hit's tail: from the
        # first message timed in the window on (a later line that only looks older — a pasted
        # log — goes with it).
        cut = next((i for i, m in enumerate(found)
                    if (ts := _rendered_ts(m)) is not None and ts >= since), len(found))
        if cut == 0:
            continue
        if cut == len(found):
            out.append(hit)
            continue
        out.append(_narrowed(hit, found, range(cut)))
    return out


def _narrowed(hit: SearchHit, found: list[str], kept: range | list[int]) -> SearchHit:
    """``hit`` holding only its messages ``kept`` (indices into ``found``, its messages): the
    text, the times, and the line range where the chunk held one message per line of its span."""
    exact = len(found) == hit.line_end - hit.line_start + 1
    idx = list(kept)
    line_start = hit.line_start + idx[0] if exact else hit.line_start
    line_end = hit.line_start + idx[-1] if exact else hit.line_end
    stamps = [ts for i in idx if (ts := message_ts(found[i])) is not None]
    return replace(hit, content="\n".join(found[i] for i in idx), line_start=line_start,
                   line_end=line_end, start_ts=min(stamps) if stamps else hit.start_ts,
                   end_ts=max(stamps) if stamps else hit.end_ts)


def _sentences(text: str) -> list[str]:
    return [s for s in _SENTENCE_END.split(text) if s.strip()]


def _key(sentence: str) -> str:
    return " ".join(sentence.casefold().split())


def without_repeats(hits: Sequence[SearchHit]) -> list[SearchHit]:
    """``hits`` in order, each without the sentences an earlier one already holds (compared
    case- and space-insensitively; a message's ``who [ts]:`` opening and a segment's ``…`` mark
    aside; sentences of fewer than :data:`REPEAT_MIN_WORDS` words, a "Yes." or "Thanks!", are
    never taken out); a message left with no sentence goes, and an excerpt left with no
    message. An excerpt that loses messages at its edges has its line range and times narrowed."""
    seen: set[str] = set()
    out: list[SearchHit] = []
    for hit in hits:
        found = messages(hit.content)
        parts = found or [hit.content]
        kept: list[int] = []
        texts: list[str] = []
        for i, part in enumerate(parts):
            opened = OPENS.match(part)
            prefix, body = (part[:opened.end()], part[opened.end():]) if opened else ("", part)
            mark = CONTINUED if body.startswith(CONTINUED) else ""
            sentences = _sentences(body[len(mark):])
            fresh = []
            for sentence in sentences:
                key = _key(sentence)
                if len(key.split()) < REPEAT_MIN_WORDS or key not in seen:
                    seen.add(key)
                    fresh.append(sentence.strip())
            if len(fresh) == len(sentences):
                kept.append(i)
                texts.append(part)
            elif fresh:
                kept.append(i)
                texts.append(prefix + mark + " ".join(fresh))
        if not kept:
            continue
        if len(kept) == len(parts) and texts == parts:
            out.append(hit)
        elif found is None:
            out.append(replace(hit, content="\n".join(texts)))
        else:
            out.append(replace(_narrowed(hit, found, kept), content="\n".join(texts)))
    return out


async def excerpts_for_prompt(response: SearchResponse, query: str, config: MemoryConfig, *,
                              floor: float | None, around: FetchAround,
                              shown: ShownHistory | None = None) -> list[SearchHit]:
    """Steps 1–5 of the module docstring over ``response``, the hybrid search for ``query``."""
    hits = relevant(response.results, query, vector_ran=response.mode != "keyword", floor=floor,
                    config=config)
    placed = for_prompt(drop_shown(hits, shown), vector_ran=False, floor=None,
                        budget_tokens=config.recall_budget_tokens)
    widened = await widen(placed, config, around)
    return without_repeats(drop_shown(widened, shown))
