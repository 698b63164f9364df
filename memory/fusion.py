"""Fusing the keyword and vector legs of a search into one ranking.

Each leg hands over its best ``candidates`` as ``(chunk_id, score)``, best first, higher
scores better (negated BM25 for keyword, cosine similarity for vector). Every chunk either leg
found stays in the fused list: nothing is dropped by a threshold here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memory.config import MemoryConfig

__all__ = ["Fused", "fuse"]

Leg = Sequence[tuple[int, float]]


@dataclass(frozen=True, slots=True)
class Fused:
    chunk_id: int
    score: float
    keyword_rank: int | None
    vector_rank: int | None


def fuse(keyword: Leg, vector: Leg, config: MemoryConfig) -> list[Fused]:
    """Reciprocal Rank Fusion: ``Σ 1/(rrf_k + rank)`` over the legs that found the chunk."""
    ranks: dict[int, list[int | None]] = {}
    for leg, (hits) in enumerate((keyword, vector)):
        for rank, (chunk_id, _score) in enumerate(hits, start=1):
            ranks.setdefault(chunk_id, [None, None])[leg] = rank
    out = [
        Fused(cid, sum(1.0 / (config.rrf_k + r) for r in pair if r is not None), pair[0], pair[1])
        for cid, pair in ranks.items()
    ]
    out.sort(key=lambda f: (-f.score, f.keyword_rank if f.keyword_rank is not None else f.vector_rank, f.chunk_id))
    return out
