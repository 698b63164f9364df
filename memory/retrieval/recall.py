"""Choosing what a search found for the model's prompt: relevant, merged, within a budget.

``memory.search`` returns ranked hits whatever their absolute relevance — a caller asked for
``k``. Recall into a prompt is different: the model reads every excerpt, so an unrelated one
(the bank PIN that happened to rank top-k for a question about gardening) costs tokens and
can mislead. :func:`for_prompt` therefore

* drops hits below a **relevance floor** on the vector leg's cosine similarity — the one
  score comparable across queries (BM25 is not: it grows with the query's rare words). The
  floor is per embedder, calibrated on the benchmark datasets (docs/memory.md), overridable
  by ``memory.recall_min_similarity``. When the vector leg ran, a hit it did not find among
  its candidates is dropped too; when it did not run (no embedder), no floor applies;
* **merges** hits from one session whose line ranges overlap or touch into one excerpt, so
  overlapping chunks do not repeat text;
* cuts the excerpts to ``memory.recall_budget_tokens`` (approximate tokens), best first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from memory.chunking import approx_tokens
from memory.retrieval.request import SearchHit

__all__ = ["CUT_MARK", "above_floor", "for_prompt", "merge_overlapping", "trim_to_tokens"]

# Ends the excerpt the budget cut (neighbour widening and the benchmark's scoring read it).
CUT_MARK = " …"


@dataclass(frozen=True, slots=True)
class _Span:
    session_key: str
    line_start: int
    line_end: int


def merge_overlapping(hits: Sequence[SearchHit]) -> list[SearchHit]:
    """Hits of one session whose line ranges overlap or touch become one, at the better rank;
    its text is the union of their lines in transcript order."""
    out: list[SearchHit] = []
    for hit in hits:
        for i, kept in enumerate(out):
            if kept.session_key == hit.session_key and hit.line_start <= kept.line_end + 1 \
                    and kept.line_start <= hit.line_end + 1:
                first, second = (kept, hit) if kept.line_start <= hit.line_start else (hit, kept)
                lines = first.content.split("\n")
                lines += [line for line in second.content.split("\n") if line not in lines]
                out[i] = replace(
                    kept, content="\n".join(lines), line_start=min(kept.line_start, hit.line_start),
                    line_end=max(kept.line_end, hit.line_end),
                    start_ts=min(filter(None, (kept.start_ts, hit.start_ts)), default=None),
                    end_ts=max(filter(None, (kept.end_ts, hit.end_ts)), default=None))
                break
        else:
            out.append(hit)
    return out


def trim_to_tokens(text: str, budget: int) -> str:
    """The longest prefix of ``text``, cut at a word, within ``budget`` approximate tokens."""
    if approx_tokens(text) <= budget:
        return text
    words = text.split(" ")
    lo, hi = 0, len(words)
    while lo < hi:  # binary search on the word count: approx_tokens is monotone in it
        mid = (lo + hi + 1) // 2
        if approx_tokens(" ".join(words[:mid])) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo]) + CUT_MARK if lo else ""


def above_floor(hits: Sequence[SearchHit], *, vector_ran: bool,
                floor: float | None) -> list[SearchHit]:
    """The hits whose cosine reaches ``floor`` when the vector leg ran (a hit it did not find
    has none, and goes); all of them without the leg or a floor."""
    if not vector_ran or floor is None:
        return list(hits)
    return [h for h in hits if h.similarity is not None and h.similarity >= floor]


def for_prompt(hits: Sequence[SearchHit], *, vector_ran: bool, floor: float | None,
               budget_tokens: int) -> list[SearchHit]:
    """The hits worth putting in a prompt, merged and within ``budget_tokens``, best first."""
    hits = above_floor(hits, vector_ran=vector_ran, floor=floor)
    out: list[SearchHit] = []
    left = budget_tokens
    for hit in merge_overlapping(hits):
        cost = approx_tokens(hit.content)
        if cost > left:
            text = trim_to_tokens(hit.content, left)
            if text:
                out.append(replace(hit, content=text))
            break
        out.append(hit)
        left -= cost
    return out
