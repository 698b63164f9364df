"""Fusing the keyword and vector legs of a search into one ranking.

Each leg hands over its best ``candidates`` as ``(chunk_id, score)``, best first, higher
scores better (negated BM25 for keyword, cosine similarity for vector). Every chunk either leg
found stays in the fused list: nothing is dropped by a threshold here.

``convex`` (the default) min-max normalises each leg's scores to [0, 1] within the query —
between the leg's best score and its ``fusion_depth``-th, lower ones clipped to 0 — and adds
them with weights ``keyword_weight`` and ``1 - keyword_weight``; a chunk one leg did not return
gets 0 from that leg. Unlike Reciprocal Rank Fusion it keeps *how much* better a leg's
first hit is than its tenth, so a leg that is sure of one chunk outweighs a leg that finds
many near-ties — equal-weight RRF let a weak leg's ranks drag hybrid below the better leg
(docs/memory.md has the table of alternatives and the cross-validation that chose this).
``rrf`` is kept for comparison: ``Σ w/(rrf_k + rank)`` with the same leg weights.

``with_recency`` then adds a third signal to a hybrid ranking: ``recency_weight · 0.5^(age /
half-life)``, the age of each chunk's last message counted back from the question's moment.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from memory.config import MemoryConfig

__all__ = ["Fused", "fuse", "with_recency"]

Leg = Sequence[tuple[int, float]]


@dataclass(frozen=True, slots=True)
class Fused:
    chunk_id: int
    score: float
    keyword_rank: int | None
    vector_rank: int | None
    similarity: float | None = None   # the vector leg's own score (cosine), when it found the chunk


def _minmax(leg: Leg, depth: int) -> dict[int, float]:
    if not leg:
        return {}
    scores = sorted((s for _, s in leg), reverse=True)
    lo, hi = scores[min(depth, len(scores)) - 1], scores[0]
    if hi <= lo:  # one hit, or the first ``depth`` tied: each of those is as good as the best
        return {cid: 1.0 if s >= hi else 0.0 for cid, s in leg}
    return {cid: max(0.0, (s - lo) / (hi - lo)) for cid, s in leg}


def _rrf(leg: Leg, rrf_k: int) -> dict[int, float]:
    return {cid: 1.0 / (rrf_k + rank) for rank, (cid, _) in enumerate(leg, start=1)}


def fuse(keyword: Leg, vector: Leg, config: MemoryConfig) -> list[Fused]:
    """One ranking of every chunk either leg found, best first (ties: leg rank, then id)."""
    kw_rank = {cid: rank for rank, (cid, _) in enumerate(keyword, start=1)}
    vec_rank = {cid: rank for rank, (cid, _) in enumerate(vector, start=1)}
    similarity = dict(vector)
    if config.fusion == "rrf":
        kw_part, vec_part = _rrf(keyword, config.rrf_k), _rrf(vector, config.rrf_k)
    else:
        kw_part, vec_part = (_minmax(keyword, config.fusion_depth),
                             _minmax(vector, config.fusion_depth))
    # A single-leg search ranks by that leg alone, whatever the weights.
    w_kw = config.keyword_weight if keyword and vector else 1.0
    w_vec = 1.0 - config.keyword_weight if keyword and vector else 1.0
    out = [
        Fused(cid, w_kw * kw_part.get(cid, 0.0) + w_vec * vec_part.get(cid, 0.0), kw_rank.get(cid),
              vec_rank.get(cid), similarity.get(cid))
        for cid in {**kw_rank, **vec_rank}
    ]
    out.sort(key=_order)
    return out


def _order(f: Fused) -> tuple[float, int, int]:
    best = min(r for r in (f.keyword_rank, f.vector_rank) if r is not None)
    return (-f.score, best, f.chunk_id)


_DAY_MS = 86_400_000


def with_recency(fused: Sequence[Fused], said_ms: Mapping[int, int | None], now_ms: int,
                 config: MemoryConfig) -> list[Fused]:
    """``fused`` re-scored with the recency term and re-sorted; a chunk without a time gets none.

    A chunk said after ``now_ms`` (only a benchmark asking about the past can see one) counts
    as said just now: it gets the full term, not a pass for being in the future.
    """
    if config.recency_weight <= 0:
        return list(fused)
    half_life_ms = config.recency_half_life_days * _DAY_MS
    out = []
    for f in fused:
        said = said_ms.get(f.chunk_id)
        boost = (0.0 if said is None
                 else config.recency_weight * 0.5 ** (max(0, now_ms - said) / half_life_ms))
        out.append(replace(f, score=f.score + boost))
    out.sort(key=_order)
    return out
