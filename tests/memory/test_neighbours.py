"""Recall widens its excerpts by the message before and after, in the tokens the budget left,
from the index's chunks only."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace

from memory.chunking import approx_tokens, iso_to_ms
from memory.config import MemoryConfig
from memory.errors import MemoryStorageError
from memory.forget_range import ForgetRange
from memory.retrieval.neighbours import ChunkSpan, widen
from memory.retrieval.request import SearchHit
from tests.memory.conftest import (
    FakeEmbedder,
    MemoryBackend,
    quiet_config,
    session_key,
    ts,
)

S = "s" * 32
MESSAGES = ["tell me about small marsupials of Australia",
            "the quokka lives on Rottnest island near Perth",
            "thanks, I will visit in spring",
            "we also talked about the weather"]


def m(line: int, text: str, who: str = "user") -> str:
    """A message as the chunker renders it, dated by its line."""
    return f"{who} [2026-11-22T10:{line:02d}:00.000Z]: {text}"


def _hit(lines: tuple[int, int], content: str) -> SearchHit:
    return SearchHit(1, S, content, 1.0, lines[0], lines[1], None, None, None, None, 0.9)


def _around(*chunks: ChunkSpan,
            fail: bool = False) -> Callable[[SearchHit], Awaitable[list[ChunkSpan]]]:
    """What the index's query returns: the chunks holding a line from before the hit to after it."""
    async def fetch(hit: SearchHit) -> list[ChunkSpan]:
        if fail:
            raise MemoryStorageError("storage error: IOError")
        return [c for c in chunks
                if c.line_end >= hit.line_start - 1 and c.line_start <= hit.line_end + 1]
    return fetch


def _budget(tokens: int) -> MemoryConfig:
    return quiet_config(recall_budget_tokens=tokens)


async def test_the_messages_either_side_join_the_excerpt_when_they_fit() -> None:
    """Separate chunks before and after: their adjacent messages join, the line range and the
    excerpt's times grow."""
    hit = replace(_hit((5, 5), m(5, "middle")), start_ts="2026-11-22T10:05:00.000Z",
                  end_ts="2026-11-22T10:05:00.000Z")
    out = await widen([hit], _budget(100),
                      _around(ChunkSpan(3, 4, 0, m(3, "three") + "\n" + m(4, "four")),
                              ChunkSpan(6, 7, 0, m(6, "six") + "\n" + m(7, "seven"))))
    assert out[0].content == "\n".join([m(4, "four"), m(5, "middle"), m(6, "six")])
    assert (out[0].line_start, out[0].line_end) == (4, 6)
    assert ((out[0].start_ts, out[0].end_ts)
            == ("2026-11-22T10:04:00.000Z", "2026-11-22T10:06:00.000Z"))


async def test_a_message_of_several_lines_is_added_whole_and_counts_as_one() -> None:
    """A reply with newlines in it (a list, code) is one message: it is added whole, and the
    count that numbers an overlapping chunk's middle messages counts it once."""
    reply = m(6, "Sure, pack these:\n- a hat\n- sunscreen", "assistant")
    question = m(4, "what should I pack?\nIt is three days.\nWe take the ferry.")
    hit = _hit((5, 5), m(5, "the quokka lives on Rottnest"))
    overlapping = ChunkSpan(3, 5, 0, "\n".join([m(3, "hello"), question,
                                                m(5, "the quokka lives on Rottnest")]))
    out = await widen([hit], _budget(200), _around(overlapping, ChunkSpan(6, 6, 0, reply)))
    assert (out[0].content == "\n".join([question, hit.content, reply])
            and (out[0].line_start, out[0].line_end) == (4, 6))


async def test_a_chunk_with_an_empty_message_in_its_span_cannot_number_its_middle() -> None:
    """Three messages over lines 2-5 (one was empty): the chunk's middle is not numbered by
    counting, so the line before the hit is not guessed."""
    hit = _hit((5, 5), m(5, "five"))
    gapped = ChunkSpan(2, 5, 0, "\n".join([m(2, "two"), m(3, "three"), m(5, "five")]))
    assert await widen([hit], _budget(100), _around(gapped)) == [hit]


async def test_a_message_split_across_chunks_is_neither_added_nor_widened_past() -> None:
    """A long message cut into segments is not a neighbour (its rest may be missing), and an
    excerpt on a message that was cut is not widened at all (where its segments end is not
    known from the excerpt)."""
    hit = _hit((5, 5), m(5, "five"))
    split_after = [ChunkSpan(6, 6, 0, m(6, "first half")),
                   ChunkSpan(6, 7, 1, m(6, "… second half") + "\n" + m(7, "x"))]
    out = await widen([hit], _budget(100), _around(ChunkSpan(4, 4, 0, m(4, "four")), *split_after))
    assert out[0].content == m(4, "four") + "\n" + hit.content
    cut_edge = _hit((5, 5), m(5, "… end of a long one"))
    chunks = [ChunkSpan(4, 5, 0, m(4, "four") + "\n" + m(5, "start of a long one")),
              ChunkSpan(5, 5, 1, cut_edge.content), ChunkSpan(6, 6, 0, m(6, "six"))]
    assert await widen([cut_edge], _budget(100), _around(*chunks)) == [cut_edge]


async def test_only_the_tokens_the_excerpts_left_are_spent() -> None:
    """A neighbour over the tokens left is not cut in; an excerpt the budget cut gets none; the
    block never exceeds the budget."""
    hit = _hit((5, 5), m(5, "middle"))
    long_after = ChunkSpan(6, 6, 0, m(6, " ".join(f"word{i}" for i in range(40))))
    budget = approx_tokens(hit.content) + approx_tokens(m(4, "four"))
    out = await widen([hit], _budget(budget), _around(ChunkSpan(4, 4, 0, m(4, "four")), long_after))
    assert out[0].content == m(4, "four") + "\n" + hit.content
    assert sum(approx_tokens(h.content) for h in out) <= budget
    cut = _hit((5, 5), m(5, "middle …"))
    assert await widen([cut], _budget(100), _around(ChunkSpan(4, 4, 0, m(4, "four")))) == [cut]


async def test_a_line_another_excerpt_holds_is_not_paid_for_twice() -> None:
    """Excerpts on lines 2 and 3: the first does not take line 3 as its neighbour, so the
    tokens stay for the second's neighbour on line 4."""
    first, second = _hit((2, 2), m(2, "two")), _hit((3, 3), m(3, "three"))
    budget = approx_tokens(first.content) + 2 * approx_tokens(second.content)
    chunks = [ChunkSpan(2, 2, 0, first.content), ChunkSpan(3, 3, 0, second.content),
              ChunkSpan(4, 4, 0, m(4, "four"))]
    out = await widen([first, second], _budget(budget), _around(*chunks))
    assert out[0].content == "\n".join([m(2, "two"), m(3, "three"), m(4, "four")])


async def test_excerpts_that_come_to_touch_merge() -> None:
    """Two excerpts of one session two lines apart become one when the first gains the line
    between them."""
    first, second = _hit((2, 2), m(2, "two")), _hit((4, 4), m(4, "four"))
    out = await widen([first, second], _budget(100), _around(ChunkSpan(3, 3, 0, m(3, "three"))))
    assert [(h.line_start, h.line_end) for h in out] == [(2, 4)]
    assert out[0].content == "\n".join([m(2, "two"), m(3, "three"), m(4, "four")])


async def test_a_failed_read_leaves_the_excerpts_as_found() -> None:
    """Widening is optional: a storage error reading the neighbours answers the excerpts the
    search found, unwidened, instead of failing recall."""
    hit = _hit((5, 5), m(5, "five"))
    assert await widen([hit], _budget(100), _around(fail=True)) == [hit]


async def _recall(memory_backend: MemoryBackend, **config: object) -> list[SearchHit]:
    async with memory_backend.opened(quiet_config(chunk_tokens=32, overlap_tokens=0, **config),
                                     FakeEmbedder()) as svc:
        return await svc.recall("alice", "Rottnest island", k=1)


async def test_recall_in_a_real_index_brings_the_question_and_the_reply_around_a_hit(
        memory_backend: MemoryBackend) -> None:
    """Through the service's recall: the hit on the quokka's island comes with the question
    before it and the reply after it; with recall_neighbours off, alone."""
    memory_backend.write("alice", "zoo", MESSAGES)
    widened = await _recall(memory_backend)
    alone = await _recall(memory_backend, recall_neighbours=False)
    assert (len(widened) == 1
            and [line.split("]: ", 1)[1] for line in widened[0].content.split("\n")]
                == MESSAGES[:3])
    assert widened[0].line_end - widened[0].line_start == 2
    assert len(alone) == 1 and alone[0].content.endswith(MESSAGES[1])


async def test_widening_never_brings_back_a_forgotten_message(
        memory_backend: MemoryBackend) -> None:
    """The neighbour's text comes from the index: a message memory.forget removed stays out of
    the prompt though the transcript still holds it."""
    memory_backend.write("alice", "zoo", MESSAGES)
    async with memory_backend.opened(quiet_config(chunk_tokens=32, overlap_tokens=0),
                                     FakeEmbedder()) as svc:
        third = iso_to_ms(ts(2))
        assert third is not None
        await svc.forget(ForgetRange("alice", session_key("zoo"), third, third + 1), record=True)
        recalled = await svc.recall("alice", "Rottnest island", k=1)
    assert "spring" not in recalled[0].content and "marsupials" in recalled[0].content


async def test_in_a_real_index_a_multi_line_question_and_reply_come_whole(
        memory_backend: MemoryBackend) -> None:
    """The real chunker's rendering: a question and a reply that hold newlines are read back as
    one message each, whole, on the right lines."""
    question = "I need a packing list.\nIt is three days long.\nAlso we take the ferry."
    reply = "Sure, pack these:\n- a hat\n- sunscreen\n- water"
    memory_backend.write("alice", "trip",
                         [question, "the quokka lives on Rottnest island near Perth", reply])
    async with memory_backend.opened(quiet_config(chunk_tokens=40, overlap_tokens=0),
                                     FakeEmbedder()) as svc:
        recalled = await svc.recall("alice", "Rottnest island", k=1)
    assert len(recalled) == 1
    assert recalled[0].content == "\n".join([f"user [{ts(0)}]: {question}",
                                             f"assistant [{ts(1)}]: the quokka lives on Rottnest "
                                             "island near Perth",
                                             f"user [{ts(2)}]: {reply}"])
    assert (recalled[0].line_start, recalled[0].line_end) == (2, 4)
