"""The time-phrase parser's work is bounded (issue 33, M3): a long question dense in time
words costs what a short one does, and the answer is the one the plain scan of every rule gives."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory.retrieval import timephrases
from memory.retrieval.request import MAX_QUERY_CHARS
from memory.retrieval.timephrases import MAX_TIME_WORDS, TimeWindow, find_time_window
from tests.memory.test_timephrases import NOW, TABLE

DENSE = ("yesterday morning last week in May 2023 two days ago on March 3rd the past 3 months "
         "recently 2024-01-02 last Monday in 2022 summer 2021 ")
# Words a phrase needs, none of which makes one: "May I", "2 may be", a future year.
HOLLOW = "May I say 2 may be in 2031 "


def reference(text: str, now: datetime) -> TimeWindow | None:
    """Every rule over the whole text, every match resolved: the leftmost (then longest)
    past window."""
    found = []
    for pattern, resolve in timephrases._RULES:
        for m in pattern.finditer(text):
            raw = resolve(m, now)
            if raw is not None and timephrases._ms(raw[0]) < timephrases._ms(now):
                found.append((m.start(), m.end(), raw))
    if not found:
        return None
    start, end, (lo, hi, exact) = min(found, key=lambda f: (f[0], -f[1]))
    return TimeWindow(timephrases._ms(lo), timephrases._ms(min(hi, now)), text[start:end], exact,
                      (start, end))


class _Counted:
    """A rule's pattern that counts its work: one per anchored match tried, one per character
    a scan (finditer/search) is asked to cover."""

    def __init__(self, pattern: re.Pattern[str], work: list[int]) -> None:
        self.pattern, self.work = pattern, work

    def match(self, text: str, pos: int = 0, endpos: int | None = None) -> re.Match[str] | None:
        self.work[0] += 1
        return self.pattern.match(text, pos, len(text) if endpos is None else endpos)

    def search(self, text: str, pos: int = 0, endpos: int | None = None) -> re.Match[str] | None:
        end = len(text) if endpos is None else endpos
        self.work[0] += max(0, end - pos)
        return self.pattern.search(text, pos, end)

    def finditer(self, text: str, pos: int = 0,
                 endpos: int | None = None) -> Iterator[re.Match[str]]:
        end = len(text) if endpos is None else endpos
        self.work[0] += max(0, end - pos)
        return self.pattern.finditer(text, pos, end)


def work_of(monkeypatch: pytest.MonkeyPatch, text: str) -> tuple[int, TimeWindow | None]:
    """The rule work (see _Counted, plus one per phrase resolved) find_time_window spends on
    ``text``."""
    work = [0]

    def counting(resolve: Any) -> Any:
        def wrapped(m: re.Match[str], now: datetime) -> Any:
            work[0] += 1
            return resolve(m, now)
        return wrapped

    with monkeypatch.context() as patch:
        patch.setattr(timephrases, "_RULES",
                      [(_Counted(p, work), counting(f)) for p, f in timephrases._RULES])
        window = find_time_window(text, NOW)
    return work[0], window


@pytest.mark.parametrize("unit", [DENSE, HOLLOW, "word " * 7 + "last week "])
def test_a_long_question_costs_what_a_short_one_does(monkeypatch: pytest.MonkeyPatch,
                                                     unit: str) -> None:
    """The parser's rule work on a question of MAX_QUERY_CHARS dense in time words is no more
    than on one of 600 characters (the scan of every rule over the whole text grew with it)."""
    short, short_window = work_of(monkeypatch, (unit * 100)[:600])
    long, long_window = work_of(monkeypatch, (unit * 1000)[:MAX_QUERY_CHARS])
    assert long <= short and long < 3 * MAX_TIME_WORDS * 25, (short, long)
    assert (short_window and short_window.phrase) == (long_window and long_window.phrase)


def test_a_dense_question_finds_its_first_phrase() -> None:
    """A question of MAX_QUERY_CHARS made of time phrases resolves to its first one, as the full
    scan does."""
    text = (DENSE * 100)[:MAX_QUERY_CHARS]
    window = find_time_window(text, NOW)
    assert (window is not None and window.phrase == "yesterday morning"
            and window == reference(text, NOW))


_FILL = "we talked about the trip and Anna said that it was fine , ok ? what did I cook".split()
_PHRASES = [text for text, *_ in TABLE] + [
    "May I ask", "2 may be", "in 2030", "tonight", "3rd of May", "on 2024-02-30", "last Monday.x",
    "Jan's", "İstanbul yesterday", "summer", "fall", "the 3rd of September, 2023",
    "during the previous couple of weeks"]


@settings(max_examples=400, deadline=None)
@given(words=st.lists(st.sampled_from(_FILL) | st.sampled_from(_PHRASES), min_size=1, max_size=16),
       hours=st.integers(min_value=-30 * 24, max_value=30 * 24))
def test_the_same_window_as_the_full_scan(words: list[str], hours: int) -> None:
    """On questions with fewer than MAX_TIME_WORDS time words, the window is the one the scan of
    every rule over the whole text finds."""
    text, now = " ".join(words), NOW + timedelta(hours=hours)
    assert find_time_window(text, now) == reference(text, now)
