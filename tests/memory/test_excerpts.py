"""Recall's rule from hits to excerpts (memory.retrieval.excerpts): the adaptive floor, the
history window left out, and no sentence twice."""

from __future__ import annotations

from memory.config import MemoryConfig
from memory.retrieval.excerpts import drop_shown, relevant, without_repeats
from memory.retrieval.request import SearchHit, ShownHistory


def hit(cid: int, content: str, *, session: str = "s1", lines: tuple[int, int] = (2, 3),
        similarity: float | None = 0.8, keyword_rank: int | None = 1,
        start_ts: str | None = "2026-11-01T10:00:00.000Z") -> SearchHit:
    return SearchHit(cid, session, content, 1.0, lines[0], lines[1], start_ts, start_ts,
                     keyword_rank, 1 if similarity is not None else None, similarity)


def msg(who: str, ts: str, text: str) -> str:
    return f"{who} [{ts}]: {text}"


T1, T2, T3 = "2026-11-01T10:00:00.000Z", "2026-11-01T10:01:00.000Z", "2026-11-01T10:02:00.000Z"


def test_a_hit_sharing_no_meaningful_word_must_clear_the_floor_by_the_margin() -> None:
    """With a margin, a hit near the floor that shares no meaningful word with the question
    goes (the speaker opening and function words do not count), one that shares a word stays,
    and one well above the floor stays whatever its words."""
    config = MemoryConfig(recall_vector_only_margin=0.1)
    question = "What is the name of my cat?"
    hits = [hit(1, msg("user", T1, "The cat sleeps all day."), similarity=0.55),
            hit(2, msg("user", T1, "What is the weather like?"), similarity=0.55),
            hit(3, msg("user", T1, "We went hiking."), similarity=0.65)]
    kept = relevant(hits, question, vector_ran=True, floor=0.5, config=config)
    assert [h.chunk_id for h in kept] == [1, 3]
    # A question made only of function words asks nothing of the words.
    assert len(relevant(hits, "what is it?", vector_ran=True, floor=0.5, config=config)) == 3


def test_hits_far_below_the_best_cosine_are_left_out() -> None:
    """The relative drop keeps what is near the best hit and drops the rest, above the floor too."""
    config = MemoryConfig(recall_relative_drop=0.1)
    hits = [hit(1, "a", similarity=0.9), hit(2, "b", similarity=0.85), hit(3, "c", similarity=0.7)]
    assert ([h.chunk_id for h in relevant(hits, "a b c", vector_ran=True, floor=0.5, config=config)]
            == [1, 2])


def test_no_floor_or_no_vector_leg_keeps_every_hit() -> None:
    """Keyword-only recall (no embedder) and an embedder without a floor apply no floor."""
    hits = [hit(1, "a", similarity=None), hit(2, "b", similarity=0.1)]
    assert relevant(hits, "q", vector_ran=False, floor=0.5, config=MemoryConfig()) == hits
    assert relevant(hits, "q", vector_ran=True, floor=None, config=MemoryConfig()) == hits


def test_the_window_s_messages_are_cut_from_a_chunk_of_the_same_session() -> None:
    """A chunk that starts before the window keeps its older messages, its range shrinks to
    them; another session's chunk and an older chunk of this one are untouched; a chunk wholly
    in the window goes."""
    content = "\n".join([msg("user", T1, "old fact."), msg("assistant", T2, "noted."),
                         msg("user", T3, "new.")])
    straddling = hit(1, content, lines=(2, 4), start_ts=T1)
    inside = hit(2, msg("user", T3, "new."), lines=(4, 4), start_ts=T3)
    other = hit(3, msg("user", T3, "elsewhere."), session="s2", start_ts=T3)
    out = drop_shown([straddling, inside, other], ShownHistory("s1", T2))
    assert [h.chunk_id for h in out] == [1, 3]
    assert (out[0].content == msg("user", T1, "old fact.")
            and (out[0].line_start, out[0].line_end) == (2, 2))
    assert out[0].end_ts == T1
    assert drop_shown([straddling], ShownHistory("s1", None)) == [straddling]


def test_a_sentence_already_in_a_better_excerpt_is_not_repeated() -> None:
    """The second excerpt loses the sentence the first holds and keeps its own; an excerpt left
    with nothing new goes; the first is unchanged."""
    first = hit(1, "\n".join([msg("user", T1, "My cat is called Felix. He is grey."),
                              msg("assistant", T2, "A fine name!")]))
    second = hit(2, "\n".join([msg("assistant", T2, "A fine name!"),
                               msg("user", T3, "He likes fish. he is grey.")]),
                 session="s2")
    third = hit(3, msg("user", T1, "my cat is called   felix."), session="s3")
    out = without_repeats([first, second, third])
    assert out[0] == first
    assert out[1].content == msg("user", T3, "He likes fish.")
    assert len(out) == 2
    sentences = [s for h in out for s in h.content.replace("\n", " ").split(". ")]
    assert len(sentences) == len(set(sentences))


def test_short_repeated_answers_and_the_segment_mark_stay() -> None:
    """"Yes." in two excerpts is two answers (fewer than three words: never taken out), and a
    later segment keeps its "… " opening when a sentence of it is a repeat."""
    first = hit(1, "\n".join([msg("user", T1, "Book the flight to Paris?"),
                              msg("assistant", T2, "Yes.")]))
    second = hit(2, "\n".join([msg("user", T1, "Book the hotel near the station?"),
                               msg("assistant", T2, "Yes.")]),
                 session="s2")
    third = hit(3, msg("assistant", T3, "… Book the flight to Paris? It leaves at noon."),
                session="s3", lines=(4, 4))
    out = without_repeats([first, second, third])
    assert out[1] == second
    assert out[2].content == msg("assistant", T3, "… It leaves at noon.")


def test_a_pasted_line_that_looks_older_does_not_bring_window_text_back() -> None:
    """A window message whose text holds a line shaped like an older message is cut with the
    rest of the window: the hit keeps only what precedes the window's first message."""
    content = "\n".join([msg("user", T1, "old fact."), msg("user", T3, "see this log:"),
                         msg("bob", "2023-05-01T00:00:00.000Z", "window text")])
    out = drop_shown([hit(1, content, lines=(2, 3), start_ts=T1)], ShownHistory("s1", T2))
    assert [h.content for h in out] == [msg("user", T1, "old fact.")]
