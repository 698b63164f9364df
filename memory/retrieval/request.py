"""What a search asks and answers: the validated :class:`SearchRequest`, its hits and
response, and the keyword leg's query terms (:func:`fts_terms`). No database here;
:mod:`memory.sqlite.search` runs the request.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Literal

from memory.chunking import CJK_CHARS, iso_to_ms
from memory.config import MemoryConfig
from memory.errors import InvalidSearch
from memory.retrieval.timephrases import TimeWindow, find_time_window, strip_time_phrase

__all__ = [
    "MAX_QUERY_CHARS",
    "MODES",
    "STOPWORDS",
    "SearchHit",
    "SearchMode",
    "SearchRequest",
    "SearchResponse",
    "ShownHistory",
    "fts_query",
    "fts_terms",
]

SearchMode = Literal["hybrid", "keyword", "vector"]
MODES: tuple[str, ...] = ("hybrid", "keyword", "vector")
MAX_QUERY_CHARS = 8000

_QUERY_RUN = re.compile(f"[{CJK_CHARS}]+|[^\\W_]+")
_CJK_RUN = re.compile(f"[{CJK_CHARS}]")


# English function words. A query's keyword leg leaves them out when it has any other word:
# each matches nearly every chunk, so OR-ing them in makes FTS5 score the whole corpus (the
# keyword leg took 143 ms p50 at 100k chunks with them, bench/README.md) while BM25 gives them
# almost no weight. A query made only of them keeps them.
STOPWORDS = frozenset("""
a about above after again against all am an and any are as at be because been before being
below between both but by can could did do does doing down during each few for from further
had has have having he her here hers herself him himself his how i if in into is it its itself
just me more most my myself no nor not now of off on once only or other our ours ourselves out
over own same she should so some such than that the their theirs them themselves then there
these they this those through to too under until up very was we were what when where which
while who whom why will with would you your yours yourself yourselves
""".split())


def fts_terms(text: str, max_terms: int = 32) -> list[str]:
    """The terms of an FTS5 MATCH expression for ``text``, each a quoted string.

    Latin/other words are Unicode letter/digit runs. CJK runs (no spaces between words) become
    overlapping character bigrams, each a phrase of two single-character tokens, matching the
    index where every CJK character is its own token. Quoting makes operators (AND, NEAR, ``*``,
    ``col:``, parentheses) plain text; the quote character itself never survives the split.
    English function words (:data:`STOPWORDS`) are left out unless nothing else remains.
    """
    # Each distinct run once, in order of first appearance (the order terms are kept in): a
    # long query repeats its words, and each one casefolded is Python work per word.
    runs = list(dict.fromkeys(_QUERY_RUN.findall(text)))
    content = [run for run in runs if run.casefold() not in STOPWORDS]
    terms: list[str] = []
    seen: set[str] = set()
    for run in content or runs:
        if _CJK_RUN.match(run):
            chars = [c for c in run if c.isalnum()]
            grams = ([chars[0]] if len(chars) == 1
                     else [f"{a} {b}" for a, b in zip(chars, chars[1:])])
        else:
            grams = [run]
        for gram in grams:
            key = gram.casefold()
            if key in seen:
                continue
            seen.add(key)
            terms.append('"' + gram.replace('"', '""') + '"')
            if len(terms) >= max_terms:
                return terms
    return terms


def fts_query(text: str, max_terms: int = 32) -> str | None:
    """:func:`fts_terms` OR-ed into one MATCH expression; None when the text has no words."""
    terms = fts_terms(text, max_terms)
    return " OR ".join(terms) if terms else None


def _parse_time(field_name: str, value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidSearch(field_name, "must be an ISO-8601 date or date-time string")
    # The indexer's own parser, so a filter reads a date exactly as chunk times were stored.
    ms = iso_to_ms(value.strip())
    if ms is None:
        raise InvalidSearch(field_name, f"not an ISO-8601 date or date-time: {value[:40]!r}")
    return ms


@dataclass(frozen=True, slots=True)
class ShownHistory:
    """The part of a session the prompt already shows: its messages timed ``since_ts`` or later
    (the history window). Recall leaves those out and may return the session's older messages:
    a long chat can recall what left its own window. ``since_ts`` None: nothing is shown."""

    session_key: str
    since_ts: str | None


@dataclass(frozen=True, slots=True)
class SearchRequest:
    """A validated search: every field checked, times as epoch milliseconds."""

    user: str
    query: str
    k: int
    mode: SearchMode
    session_key: str | None = None
    exclude_session_key: str | None = None
    after_ms: int | None = None
    before_ms: int | None = None
    window: TimeWindow | None = None   # a time phrase in the query ("last week"), if any
    now_ms: int | None = None          # when the question is asked: recency counts back from it
    recency: bool = False              # add the recency term (recall into a prompt)
    # ShownHistory: chunks of this session starting at or after this time are left out.
    shown_session_key: str | None = None
    shown_since_ms: int | None = None

    @classmethod
    def build(cls, config: MemoryConfig, user: str, query: object, *, k: object = None,
              mode: object = "hybrid", session_key: object = None,
              exclude_session_key: object = None, after: object = None, before: object = None,
              now: datetime | None = None, recency: bool = False,
              shown: ShownHistory | None = None) -> SearchRequest:
        """Validate every field; ``now`` (default: the clock, local time zone) anchors time phrases
        and, with ``recency``, the recency term of a hybrid search."""
        if not isinstance(query, str) or not query.strip():
            raise InvalidSearch("query", "must be a non-empty string")
        if k is None:
            k = config.default_k
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= config.max_k:
            raise InvalidSearch("k", f"must be an integer from 1 to {config.max_k}")
        if mode not in MODES:
            raise InvalidSearch("mode", "must be one of hybrid, keyword, vector")
        for name, value in (("sessionKey", session_key),
                            ("excludeSessionKey", exclude_session_key)):
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidSearch(name, "must be a non-empty string")
        after_ms = _parse_time("after", after)
        before_ms = _parse_time("before", before)
        if after_ms is not None and before_ms is not None and after_ms >= before_ms:
            raise InvalidSearch("before", "must be later than after")
        query = query[:MAX_QUERY_CHARS]
        moment = (now or datetime.now()).astimezone()
        window = find_time_window(query, moment) if config.time_phrases else None
        since_ms = iso_to_ms(shown.since_ts) if shown is not None else None
        return cls(user, query, k, mode, session_key, exclude_session_key,  # type: ignore[arg-type]
                   after_ms, before_ms, window, int(moment.timestamp() * 1000), recency,
                   shown.session_key if shown is not None and since_ms is not None else None,
                   since_ms)

    def within_window(self) -> SearchRequest | None:
        """This search narrowed to its time phrase's window (None when there is none or the
        explicit after/before leave nothing of it); the phrase itself is dropped from the query."""
        if self.window is None:
            return None
        after = (self.window.start_ms if self.after_ms is None
                 else max(self.window.start_ms, self.after_ms))
        before = (self.window.end_ms if self.before_ms is None
                  else min(self.window.end_ms, self.before_ms))
        if after >= before:
            return None
        return replace(self, query=strip_time_phrase(self.query, self.window) or self.query,
                       after_ms=after, before_ms=before, window=None)


@dataclass(frozen=True, slots=True)
class SearchHit:
    chunk_id: int
    session_key: str
    content: str
    score: float
    line_start: int
    line_end: int
    start_ts: str | None
    end_ts: str | None
    keyword_rank: int | None
    vector_rank: int | None
    similarity: float | None = None   # cosine to the query, when the vector leg found it


@dataclass(frozen=True, slots=True)
class SearchResponse:
    results: list[SearchHit]
    mode: str                       # the mode actually run
    fallback_reason: str | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)
    # During a rebuild: the previous model whose vectors ranked the vector leg (its cosines).
    previous_model: str | None = None


# The keyword leg: BM25 over the user's chunks (FTS5's bm25() is lower-is-better; the leg
# reports its negation so every leg's score is higher-is-better).
