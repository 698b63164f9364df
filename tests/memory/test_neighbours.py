"""Recall widens its excerpts by the message before and after, in the tokens the budget left,
from the index's chunks only."""

from __future__ import annotations

from pathlib import Path

from memory.chunking import approx_tokens, iso_to_ms
from memory.forgetting import ForgetRange
from memory.retrieval.neighbours import Around, ChunkSpan, widen
from memory.retrieval.request import SearchHit
from tests.memory.conftest import (
    FakeEmbedder,
    opened,
    quiet_config,
    session_key,
    ts,
    write_transcript,
)

S = "s" * 32
MESSAGES = ["tell me about small marsupials of Australia",
            "the quokka lives on Rottnest island near Perth",
            "thanks, I will visit in spring",
            "we also talked about the weather"]


def _hit(lines: tuple[int, int], content: str) -> SearchHit:
    return SearchHit(1, S, content, 1.0, lines[0], lines[1], None, None, None, None, 0.9)


def _around(before: ChunkSpan | None, after: ChunkSpan | None) -> object:
    async def fetch(_hit: SearchHit) -> Around:
        return Around(before, after)
    return fetch


async def test_the_messages_either_side_join_the_excerpt_when_they_fit() -> None:
    """Separate chunks before and after: their adjacent lines join, the line range grows."""
    hit = _hit((5, 5), "u: middle")
    out = await widen([hit], quiet_config(recall_budget_tokens=100),
                      _around(ChunkSpan(3, 4, "u: three\na: four"), ChunkSpan(6, 7, "u: six\na: seven")))  # type: ignore[arg-type]
    assert out[0].content == "a: four\nu: middle\nu: six" and (out[0].line_start, out[0].line_end) == (4, 6)


async def test_an_overlapping_chunk_gives_the_line_next_to_the_excerpt_by_counting() -> None:
    """A neighbour in the middle of an overlapping chunk is numbered from the chunk's first line
    (its lines are contiguous); one whose lines have a gap is not used."""
    hit = _hit((5, 6), "u: five\na: six")
    overlapping = ChunkSpan(3, 6, "u: three\na: four\nu: five\na: six")
    out = await widen([hit], quiet_config(recall_budget_tokens=100), _around(overlapping, None))  # type: ignore[arg-type]
    assert out[0].content == "a: four\nu: five\na: six" and out[0].line_start == 4
    gapped = ChunkSpan(1, 6, "u: one\na: four\nu: five\na: six")  # four lines over six numbers
    out = await widen([hit], quiet_config(recall_budget_tokens=100), _around(gapped, None))  # type: ignore[arg-type]
    assert out == [hit]


async def test_a_neighbour_that_does_not_fit_whole_is_left_out_and_hits_keep_their_place() -> None:
    """Only the tokens the excerpts left are spent; a neighbour over them is not cut in, and an
    excerpt the budget already cut gets none."""
    hit = _hit((5, 5), "u: middle")
    long_after = ChunkSpan(6, 6, "a: " + " ".join(f"word{i}" for i in range(40)))
    budget = approx_tokens(hit.content) + 10
    out = await widen([hit], quiet_config(recall_budget_tokens=budget),
                      _around(ChunkSpan(4, 4, "a: four"), long_after))  # type: ignore[arg-type]
    assert out[0].content == "a: four\nu: middle"
    cut = _hit((5, 5), "u: middle …")
    assert await widen([cut], quiet_config(recall_budget_tokens=100),
                       _around(ChunkSpan(4, 4, "a: four"), None)) == [cut]  # type: ignore[arg-type]


async def test_excerpts_that_come_to_touch_merge() -> None:
    """Two excerpts of one session two lines apart become one when the first gains the line
    between them."""
    first, second = _hit((2, 2), "u: two"), _hit((4, 4), "u: four")
    out = await widen([first, second], quiet_config(recall_budget_tokens=100),
                      _around(None, ChunkSpan(3, 3, "a: three")))  # type: ignore[arg-type]
    assert [(h.line_start, h.line_end) for h in out] == [(2, 4)]
    assert out[0].content == "u: two\na: three\nu: four"


async def _recall(tmp_path: Path, **config: object) -> list[SearchHit]:
    async with opened(tmp_path, quiet_config(chunk_tokens=32, overlap_tokens=0, **config), FakeEmbedder()) as svc:
        return await svc.recall("alice", "Rottnest island", k=1)


async def test_recall_in_a_real_index_brings_the_question_and_the_reply_around_a_hit(tmp_path: Path) -> None:
    """Through MemoryService.recall: the hit on the quokka's island comes with the question
    before it and the reply after it; with recall_neighbours off, alone."""
    write_transcript(tmp_path, "alice", "zoo", MESSAGES)
    widened = await _recall(tmp_path)
    alone = await _recall(tmp_path, recall_neighbours=False)
    assert len(widened) == 1 and [line.split("]: ", 1)[1] for line in widened[0].content.split("\n")] == MESSAGES[:3]
    assert widened[0].line_end - widened[0].line_start == 2
    assert len(alone) == 1 and alone[0].content.endswith(MESSAGES[1])


async def test_widening_never_brings_back_a_forgotten_message(tmp_path: Path) -> None:
    """The neighbour's text comes from the index: a message memory.forget removed stays out of
    the prompt though the transcript still holds it."""
    write_transcript(tmp_path, "alice", "zoo", MESSAGES)
    async with opened(tmp_path, quiet_config(chunk_tokens=32, overlap_tokens=0), FakeEmbedder()) as svc:
        third = iso_to_ms(ts(2))
        assert third is not None
        await svc.forget(ForgetRange("alice", session_key("zoo"), third, third + 1), record=True)
        recalled = await svc.recall("alice", "Rottnest island", k=1)
    assert "spring" not in recalled[0].content and "marsupials" in recalled[0].content
