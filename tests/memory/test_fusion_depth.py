"""Convex fusion scales each leg between its best score and its ``fusion_depth``-th."""

from __future__ import annotations

import pytest

from memory.config import MemoryConfig
from memory.retrieval.fusion import fuse

KEYWORD = [(1, 10.0), (2, 9.0), (3, 8.0), (4, 1.0), (5, 0.5)]
VECTOR = [(3, 0.9), (6, 0.8), (1, 0.7)]


def test_a_candidate_below_the_depth_gets_nothing_from_that_leg() -> None:
    """Below a leg's depth-th score a chunk adds nothing from that leg; over the whole list it
    still added a share."""
    shallow = {f.chunk_id: f.score for f in fuse(KEYWORD, VECTOR, MemoryConfig(fusion_depth=3))}
    deep = {f.chunk_id: f.score for f in fuse(KEYWORD, VECTOR, MemoryConfig(fusion_depth=50))}
    assert shallow[4] == shallow[5] == 0.0
    assert deep[4] > 0.0
    assert shallow[1] == deep[1] and shallow[3] > shallow[2]


def test_ties_within_the_depth_all_count_as_the_best() -> None:
    """A leg whose first ``depth`` scores are equal gives each of them its full share."""
    fused = fuse([(1, 2.0), (2, 2.0), (3, 1.0)], [], MemoryConfig(fusion_depth=2))
    assert [(f.chunk_id, f.score) for f in fused] == [(1, 1.0), (2, 1.0), (3, 0.0)]


def test_the_defaults_are_the_cross_validated_ones() -> None:
    """Keyword weight 0.3 and depth 15 (docs/memory.md, "Fusion"); a depth under 2 is refused."""
    config = MemoryConfig()
    assert (config.fusion, config.keyword_weight, config.fusion_depth) == ("convex", 0.3, 15)
    with pytest.raises(ValueError, match="fusion_depth must be at least 2"):
        MemoryConfig(fusion_depth=1)
