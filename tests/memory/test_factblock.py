"""The trailing memory block of block mode: hold-back while streaming, stripping, parsing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory.facts.block import (
    BLOCK_CLOSE,
    BLOCK_OPEN,
    BlockFilter,
    FactBlock,
    MalformedBlock,
    RememberItem,
    parse_block,
)

BLOCK = f'\n\n{BLOCK_OPEN}\n{{"remember": [{{"text": "My cat is called Luna"}}]}}\n{BLOCK_CLOSE}\n'


def run_filter(pieces: list[str], max_chars: int = 4000) -> tuple[list[str], str, str | None, str]:
    """Feed the pieces; return what was sent after each, the finish tail, the body, the region."""
    f = BlockFilter(max_chars)
    sent = [f.feed(p) for p in pieces]
    end = f.finish()
    return sent, end.tail, end.body, end.region


def chunked(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(points, points[1:], strict=False)]


def test_trailing_block_is_stripped_and_parsed() -> None:
    """A block at the end is held back whole, with the blank lines before it, and parses."""
    sent, tail, body, region = run_filter(["Nice to meet you, Luna's owner!", BLOCK])
    assert "".join(sent) + tail == "Nice to meet you, Luna's owner!"
    assert region == BLOCK
    assert parse_block(body) == FactBlock((RememberItem("My cat is called Luna"),), ())


def test_block_split_into_single_characters() -> None:
    """Fed one character at a time, the output and the block are the same as in one piece."""
    text = "Sure." + BLOCK
    sent, tail, body, region = run_filter(list(text))
    assert "".join(sent) + tail == "Sure." and region == BLOCK
    assert parse_block(body).remember[0].text == "My cat is called Luna"


def test_ordinary_text_is_never_delayed() -> None:
    """Text with no '<' and no trailing space is sent on in full by each feed."""
    f = BlockFilter(4000)
    assert f.feed("Hello") == "Hello"
    assert f.feed(" there, friend") == " there, friend"
    assert f.feed(" x") == " x"


def test_only_a_possible_tag_start_is_held() -> None:
    """A line-start prefix of the opening tag is held until it is disproved, then sent on."""
    f = BlockFilter(4000)
    assert f.feed("Look:\n<mem") == "Look:"
    assert f.feed("ories are nice") == "\n<memories are nice"
    assert f.finish().tail == ""


def test_mid_line_tag_and_non_trailing_block_stream_intact() -> None:
    """The tag inside a line, or a closed block followed by more text, is ordinary text."""
    text = (f"Write {BLOCK_OPEN} like this.\n{BLOCK_OPEN}\n{{\"forget\": [1]}}\n{BLOCK_CLOSE}\n"
            "and then keep talking.")
    sent, tail, body, region = run_filter(chunked(text, [3, 9, 20, 30, 41, 60, 75, 80]))
    assert "".join(sent) + tail == text and region == "" and body is None


def test_too_long_candidate_is_released() -> None:
    """Text after a line-start tag longer than the limit is sent on as ordinary text."""
    text = f"Intro\n{BLOCK_OPEN}" + "x" * 100
    sent, tail, _, region = run_filter(chunked(text, list(range(0, len(text), 7))), max_chars=50)
    assert "".join(sent) + tail == text and region == ""


def test_unclosed_block_is_stripped_as_malformed() -> None:
    """A trailing block never closed is stripped, and parsing it says why."""
    sent, tail, body, region = run_filter(["Done.", f"\n{BLOCK_OPEN}\n{{\"remember\": ["])
    assert "".join(sent) + tail == "Done." and region
    with pytest.raises(MalformedBlock, match="never closed"):
        parse_block(body)


@pytest.mark.parametrize("body", [
    "not json", "[1, 2]", '{"remember": "x"}', '{"remember": [{"text": 5}]}', '{"forget": ["a"]}',
    '{"forget": [true]}', '{"remember": [{"text": "a", "replaces": "b"}]}', '{"save": []}',
    '{"remember": [{"text": "a", "why": 1}]}',
])
def test_malformed_bodies_are_refused(body: str) -> None:
    """Anything but the documented shape raises MalformedBlock."""
    with pytest.raises(MalformedBlock):
        parse_block(body)


def test_fenced_json_and_bare_strings_are_accepted() -> None:
    """A body wrapped in a json code fence, and remember entries given as bare strings, parse."""
    block = parse_block('\n```json\n{"remember": ["I live in Oslo", {"text": "I am 40", '
                        '"replaces": 3}], "forget": [7]}\n```\n')
    assert block == FactBlock((RememberItem("I live in Oslo"), RememberItem("I am 40", 3)), (7,))


_ALPHABET = st.sampled_from(["a", " ", "\n", "<", ">", "/", "x", BLOCK_OPEN, BLOCK_CLOSE,
                             BLOCK_OPEN[:4], '{"forget": [1]}', "\t"])


@settings(max_examples=400, deadline=None)
@given(parts=st.lists(_ALPHABET, max_size=14), cuts=st.lists(st.integers(0, 200), max_size=12),
       max_chars=st.sampled_from([20, 4000]))
def test_output_plus_block_is_the_input_for_any_chunking(parts: list[str], cuts: list[int],
                                                         max_chars: int) -> None:
    """For any text and chunking, what is sent on plus the stripped block is the input, and the
    outcome is the same as when the text arrives in one piece."""
    text = "".join(parts)
    sent, tail, body, region = run_filter(chunked(text, cuts), max_chars)
    assert "".join(sent) + tail + region == text
    whole = run_filter([text], max_chars)
    assert (("".join(whole[0]) + whole[1], whole[2], whole[3])
            == ("".join(sent) + tail, body, region))
    if region:
        assert (region.lstrip().startswith(BLOCK_OPEN)
                and (body is None or region.rstrip().endswith(BLOCK_CLOSE)))


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=st.characters(blacklist_characters="<"), max_size=80),
       cuts=st.lists(st.integers(0, 80), max_size=8))
def test_text_without_a_tag_is_held_only_as_trailing_space(text: str, cuts: list[int]) -> None:
    """Without a '<', everything but trailing whitespace is sent on at once."""
    f = BlockFilter(4000)
    so_far = ""
    for piece in chunked(text, cuts):
        so_far += f.feed(piece)
    assert so_far == text.rstrip() if text.strip() else so_far == ""
    assert so_far + f.finish().tail == text


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(_ALPHABET, max_size=14), cuts=st.lists(st.integers(0, 200), max_size=12))
def test_only_a_possible_block_start_is_ever_held(parts: list[str], cuts: list[int]) -> None:
    """After every feed, what was sent is a prefix of what came in, and what is held is only
    whitespace plus a proper prefix of the opening tag, or a block begun by the full tag."""
    text = "".join(parts)
    f = BlockFilter(4000)
    received = sent = ""
    for piece in chunked(text, cuts):
        received += piece
        sent += f.feed(piece)
        assert received.startswith(sent)
        held = received[len(sent):].lstrip()
        assert held.startswith(BLOCK_OPEN) or BLOCK_OPEN.startswith(held) and held != BLOCK_OPEN
