"""Chunking rules: rendering, sizes, overlap, boundaries, determinism."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from memory.chunking import CJK_CHARS, approx_tokens, chunk_messages, fts_text
from sessions import Message, TranscriptEntry


def msg(line: int, content: str, role: str = "user", name: str | None = None,
        ts: str | None = None) -> TranscriptEntry:
    message = Message(id=f"m{line}", role=role, content=content,
                      ts=ts or f"2026-11-22T10:{line:02d}:00.000Z", run_id=None, name=name)
    return TranscriptEntry(line=line, offset=line * 100, message=message)


def test_renders_role_timestamp_and_text() -> None:
    """A message renders as ``role [ts]: text``."""
    (chunk,) = chunk_messages([msg(2, "hello world")], 400, 80)
    assert chunk.content == "user [2026-11-22T10:02:00.000Z]: hello world"
    assert (chunk.line_start, chunk.line_end) == (2, 2)


def test_name_replaces_role() -> None:
    """A speaker name, when present, is shown instead of the role."""
    (chunk,) = chunk_messages([msg(2, "hi", role="assistant", name="Ada")], 400, 80)
    assert chunk.content.startswith("Ada [")


def test_token_approximation_rule() -> None:
    """A word costs ceil(len/4) tokens (min 1) and a CJK character costs 1."""
    assert approx_tokens("a bb ccccc") == 1 + 1 + 2
    assert approx_tokens("東京タワー") == 5
    assert approx_tokens("") == 0


def test_chunks_cut_at_message_boundaries_with_overlap() -> None:
    """Short messages are never split, chunks stay within budget, and consecutive chunks
    share a tail."""
    messages = [msg(i + 2, " ".join(f"word{i}x{j}" for j in range(20))) for i in range(30)]
    chunks = chunk_messages(messages, 160, 60)  # each message ≈ 48 tokens
    assert len(chunks) > 3
    for chunk in chunks:
        assert approx_tokens(chunk.content) <= 160
        for line in chunk.content.split("\n"):
            assert line.startswith("user [")
    for prev, nxt in zip(chunks, chunks[1:]):
        assert nxt.line_start <= prev.line_end  # overlap carried over
        assert nxt.line_end > prev.line_end     # always progresses
    assert chunks[0].start_ts == "2026-11-22T10:02:00.000Z"
    assert chunks[-1].end_ts == messages[-1].message.ts


def test_long_message_split_between_words() -> None:
    """A message longer than a chunk is cut between words, never inside one, and keeps its line."""
    words = [f"w{i:04d}" for i in range(600)]
    chunks = chunk_messages([msg(2, " ".join(words))], 100, 20)
    assert len(chunks) > 5
    seen: set[str] = set()
    for chunk in chunks:
        assert chunk.line_start == chunk.line_end == 2
        body = chunk.content.split(": ", 1)[1].removeprefix("… ")
        for token in body.split():
            assert token in words  # whole words only
            seen.add(token)
    assert seen == set(words)
    assert chunks[1].content.startswith("user [2026-11-22T10:02:00.000Z]: … ")


def test_cjk_text_split_between_characters() -> None:
    """CJK text without spaces is split between characters and fully covered."""
    text = "東京に行きたいです" * 80
    chunks = chunk_messages([msg(2, text)], 60, 10)
    assert len(chunks) > 2
    joined = "".join(c.content.split(": ", 1)[1].removeprefix("… ").replace(" ", "")
                     for c in chunks)
    assert all(ch in joined for ch in "東京に行きたいです")


def test_fts_text_spaces_cjk() -> None:
    """The FTS text puts each CJK character apart and leaves other words alone."""
    assert fts_text("Rust 東京").split() == ["Rust", "東", "京"]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab é☕ 東ｱ\u3000\t\n"), max_size=60))
def test_the_ascii_shortcut_counts_and_spaces_as_the_rule_does(text: str) -> None:
    """ASCII text skips the CJK scan; any text (accents, emoji, CJK, full-width spaces) gets the
    count and the FTS text of the rule itself: one token per CJK character or per four other
    characters of a word, CJK characters spaced apart."""
    assert approx_tokens(text) == len(re.findall(f"[{CJK_CHARS}]|[^\\s{CJK_CHARS}]{{1,4}}", text))
    spaced = re.sub(f"([{CJK_CHARS}])", r" \1 ", text)
    assert fts_text(text) == spaced


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="ab 東", min_size=1, max_size=300).filter(str.strip),
                min_size=1, max_size=25),
       st.integers(min_value=20, max_value=120))
def test_repacking_from_last_chunk_matches_full_pack(texts: list[str], budget: int) -> None:
    """Packing again from the last chunk's first unit gives the same chunks as packing
    everything."""
    messages = [msg(i + 2, t) for i, t in enumerate(texts)]
    full = chunk_messages(messages, budget, budget // 4)
    prefix_len = max(1, len(messages) // 2)
    head = chunk_messages(messages[:prefix_len], budget, budget // 4)
    last = head[-1]
    tail = chunk_messages([m for m in messages if m.line >= last.line_start], budget, budget // 4,
                          first_idx=last.idx, skip_segments=last.seg_start)
    assert head[:-1] + tail == full
