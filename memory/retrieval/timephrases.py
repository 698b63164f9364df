"""Time phrases in a question ("yesterday", "last week", "in May 2023") → a UTC time window.

Pure and deterministic: the caller passes the question and the moment it was asked (``now``,
timezone-aware). Calendar arithmetic happens in ``now``'s timezone — "yesterday" means the
asker's yesterday — and the result is a half-open window ``[start_ms, end_ms)`` in UTC epoch
milliseconds, the unit of ``chunks.start_ms``/``end_ms``.

Why a window and not a point: a message is recorded at one instant, but a question names a
period ("last week") or a fuzzy point ("two months ago"); a window lets search filter or boost
chunks that overlap it. Rules:

* Calendar periods are whole local units: a day is midnight to midnight, a week starts on
  Monday (ISO), seasons are northern-hemisphere meteorological (spring Mar–May, summer Jun–Aug,
  autumn/fall Sep–Nov, winter Dec–Feb; "winter 2023" is Dec 2023–Feb 2024). Parts of a day:
  morning 05–12, afternoon 12–18, evening 18–24, night 18–06 ("tonight" asked before 06:00 is
  the night that began yesterday).
* A memory only holds what was said before the question, so every window ends at ``now`` at
  the latest, and a phrase whose window starts at or after ``now`` ("tonight" asked at 15:00,
  "on 2030-01-01") is ignored.
* Without a year, a month or date means the most recent one not after today ("in December"
  asked in January is last December); "last May" excludes the current month; "on/last Monday"
  is 1–7 days back. A bare weekday ("Monday meetings") or bare "May" ("May I ask") is not a
  time phrase: a wrong filter hides the right answer, a missed one only ranks it lower.
* "N units ago" (day/night, week/weekend, month, year) is fuzzy by nature, so it becomes the
  days from N+1 to N-1 units back — one unit either side of the point. Vague counts are ranges
  (a couple 2–3, a few 2–4, several 3–7): the window is hi+1 to lo-1 units back, ``exact=False``.
* "past/last N units" is the span from N units back (at local midnight) to now; a vague N uses
  its upper bound, ``exact=False``.
* "recently"/"lately" is the last 30 days, "the other day" 2–7 days back, both ``exact=False``:
  soft windows should boost rather than filter.

When several phrases occur, the leftmost wins, and the longest among those starting there
("yesterday morning" over "yesterday"). ``TimeWindow.span`` is where it was found, so
``strip_time_phrase`` can take it out of the keyword query.
"""

from __future__ import annotations

import calendar
import re
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, tzinfo

__all__ = ["MAX_TIME_WORDS", "TimeWindow", "find_time_window", "strip_time_phrase"]


@dataclass(frozen=True, slots=True)
class TimeWindow:
    """``[start_ms, end_ms)`` in UTC epoch ms; ``phrase`` is ``text[span[0]:span[1]]``."""

    start_ms: int
    end_ms: int
    phrase: str
    exact: bool
    span: tuple[int, int]


_Raw = tuple[datetime, datetime, bool]  # local start, local end, exact
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_RECENT_DAYS = 30
_PARTS = {"morning": (5, 12), "afternoon": (12, 18), "evening": (18, 24), "night": (18, 30)}
_SEASONS = {"spring": 3, "summer": 6, "autumn": 9, "fall": 9, "winter": 12}
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_MONTHS = {name: i for i, names in enumerate((
    "january jan", "february feb", "march mar", "april apr", "may", "june jun", "july jul",
    "august aug", "september sept sep", "october oct", "november nov", "december dec"), 1)
    for name in names.split()}
_WORDS = ("one two three four five six seven eight nine ten eleven twelve").split()
_COUNTS: dict[str, tuple[int, int]] = {w: (i, i) for i, w in enumerate(_WORDS, 1)}
_COUNTS |= {"a": (1, 1), "an": (1, 1), "couple": (2, 3), "few": (2, 4), "several": (3, 7)}
_VAGUE = frozenset({"couple", "few", "several"})

_MON = "(?P<mon>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_NUM = (r"(?P<num>\d{1,3}|an?|" + "|".join(_WORDS)
        + r"|(?:a\s+)?couple(?:\s+of)?|(?:a\s+)?few|several)")
_UNIT = r"(?P<unit>day|night|weekend|week|month|year)s?"
_YEAR = r"(?P<year>(?:19|20)\d\d)"
_DAY = r"(?P<day>\d{1,2})(?P<suf>st|nd|rd|th)?"
_ON = r"(?P<on>(?:on|in|during)\s+)?(?:the\s+)?"


def _at(d: date, tz: tzinfo | None, hours: int = 0) -> datetime:
    # Adding hours to an aware datetime moves the wall clock, so 05:00 stays 05:00 on DST days.
    return datetime(d.year, d.month, d.day, tzinfo=tz) + timedelta(hours=hours)


def _add_months(d: date, n: int) -> date:
    y, m = divmod(d.year * 12 + d.month - 1 + n, 12)
    return date(y, m + 1, min(d.day, calendar.monthrange(y, m + 1)[1]))


def _shift(d: date, n: int, unit: str) -> date:
    """``d`` moved ``n`` units (weekend counts as week, night as day), months clamped."""
    if unit in ("month", "year"):
        return _add_months(d, n * (12 if unit == "year" else 1))
    return d + timedelta(days=n * (7 if unit in ("week", "weekend") else 1))


def _days(a: date, b: date, now: datetime, exact: bool = True) -> _Raw:
    return _at(a, now.tzinfo), _at(b, now.tzinfo), exact


def _count(m: re.Match[str]) -> tuple[int, int, bool]:
    words = m["num"].lower().split()
    key = words[-2] if words[-1] == "of" else words[-1]
    lo, hi = (int(key), int(key)) if key.isdigit() else _COUNTS[key]
    return lo, hi, key not in _VAGUE


def _relative_day(m: re.Match[str], now: datetime) -> _Raw:
    word = " ".join(m["word"].lower().split())
    back = {"yesterday": 1, "last night": 1, "the day before yesterday": 2}.get(word, 0)
    day, part = now.date() - timedelta(days=back), (m["part"] or "").lower()
    if word in ("tonight", "last night"):
        part = "night"
        if word == "tonight" and now.hour < 6:  # at 02:00, tonight began yesterday
            day -= timedelta(days=1)
    if not part:
        return _days(day, day + timedelta(days=1), now)
    lo, hi = _PARTS[part]
    return _at(day, now.tzinfo, lo), _at(day, now.tzinfo, hi), True


def _calendar_unit(m: re.Match[str], now: datetime) -> _Raw:
    today, which, unit = now.date(), m["which"].lower().split()[-1], m["unit"].lower()
    if which == "past" and unit != "weekend":
        return _days(_shift(today, -1, unit), today + timedelta(days=1), now)
    back = 0 if which == "this" else -1
    if unit in ("week", "weekend"):
        monday = today - timedelta(days=today.weekday()) + timedelta(weeks=back)
        if unit == "weekend":
            return _days(monday + timedelta(days=5), monday + timedelta(days=7), now)
        return _days(monday, monday + timedelta(weeks=1), now)
    if unit == "month":
        first = _add_months(today.replace(day=1), back)
    else:
        first = date(today.year + back, 1, 1)
    return _days(first, _shift(first, 1, unit), now)


def _weekday(m: re.Match[str], now: datetime) -> _Raw:
    today, target = now.date(), _WEEKDAYS.index(m["wd"].lower())
    if m["which"].lower() == "this":
        day = today - timedelta(days=today.weekday() - target)
    else:  # "last/on/past Monday": the most recent one before today
        day = today - timedelta(days=(today.weekday() - target - 1) % 7 + 1)
    return _days(day, day + timedelta(days=1), now)


def _season(m: re.Match[str], now: datetime) -> _Raw | None:
    today, start_month = now.date(), _SEASONS[m["season"].lower()]
    if not (m["which"] or m["year"]):
        return None  # "in the summer" is a habit more often than a date; "fall" a verb
    if m["year"]:
        year = int(m["year"])
    else:  # "this": latest to have begun; "last"/"past": latest to have ended
        year, months_in = today.year, 0 if m["which"].lower() == "this" else 3
        while _add_months(date(year, start_month, 1), months_in) > today:
            year -= 1
    first = date(year, start_month, 1)
    return _days(first, _add_months(first, 3), now)


def _ago(m: re.Match[str], now: datetime) -> _Raw:
    lo, hi, exact = _count(m)
    unit, today = m["unit"].lower(), now.date()
    return _days(_shift(today, -(hi + 1), unit), _shift(today, -(lo - 1), unit) + timedelta(days=1),
                 now, exact)


def _past_n(m: re.Match[str], now: datetime) -> _Raw:
    _, hi, exact = _count(m)
    return _at(_shift(now.date(), -hi, m["unit"].lower()), now.tzinfo), now, exact


def _soft(m: re.Match[str], now: datetime) -> _Raw:
    today = now.date()
    if m["word"].lower().endswith("day"):  # "the other day"
        return _days(today - timedelta(days=7), today - timedelta(days=1), now, exact=False)
    return _at(today - timedelta(days=_RECENT_DAYS), now.tzinfo), now, False


def _month(m: re.Match[str], now: datetime) -> _Raw | None:
    today, month = now.date(), _MONTHS[m["mon"].lower()]
    which = (m["which"] or "").lower()
    if m["year"]:
        year = int(m["year"])
    elif not which:
        return None  # a bare month name: "May I ask …", "we march on", "Jan said"
    elif which == "this":
        year = today.year
    else:  # "in May": the latest May not after now; "last May": not the current month either
        year = today.year - (month > today.month or (which == "last" and month == today.month))
    first = date(year, month, 1)
    return _days(first, _add_months(first, 1), now)


def _day(year: str | None, month: int, day: int, now: datetime) -> _Raw | None:
    """One calendar day; without a year the latest valid one not after today."""
    today = now.date()
    years = [int(year)] if year else range(today.year, today.year - 9, -1)  # 8 years reach a Feb 29
    for y in years if 1 <= month <= 12 and day >= 1 else ():
        if day <= calendar.monthrange(y, month)[1] and (year or date(y, month, day) <= today):
            return _days(date(y, month, day), date(y, month, day) + timedelta(days=1), now)
    return None


def _month_day(m: re.Match[str], now: datetime) -> _Raw | None:
    return _day(m["year"], _MONTHS[m["mon"].lower()], int(m["day"]), now)


def _day_month(m: re.Match[str], now: datetime) -> _Raw | None:
    if m["mon"].lower() == "may" and not (m["year"] or m["suf"] or m["of"] or m["on"]):
        return None  # "2 may be …"
    return _day(m["year"], _MONTHS[m["mon"].lower()], int(m["day"]), now)


def _iso(m: re.Match[str], now: datetime) -> _Raw | None:
    return _day(m["year"], int(m["mm"]), int(m["day"]), now)


def _year(m: re.Match[str], now: datetime) -> _Raw:
    return _days(date(int(m["year"]), 1, 1), date(int(m["year"]) + 1, 1, 1), now)


_Rule = tuple[re.Pattern[str], Callable[[re.Match[str], datetime], _Raw | None]]
_RULES: list[_Rule] = [(re.compile(p, re.IGNORECASE), f) for p, f in [
    (r"\b(?P<word>the\s+day\s+before\s+yesterday|yesterday|(?:earlier\s+)?today|tonight|last\s+night"
     r"|this(?=\s+(?:morning|afternoon|evening)))(?:\s+(?P<part>morning|afternoon|evening|night))?\b",
     _relative_day),
    (r"\b(?:(?:in|over|during)\s+)?(?:the\s+)?(?P<which>this|last|past|previous|earlier\s+this)"
     r"\s+(?P<unit>week|weekend|month|year)\b", _calendar_unit),
    (r"\b(?P<which>this|last|past|on)\s+(?P<wd>" + "|".join(_WEEKDAYS) + r")\b(?!\.\w)", _weekday),
    (r"\b(?:(?:the\s+)?(?P<which>this|last|past)\s+|(?:in|during)\s+)?(?:the\s+)?"
     r"(?P<season>spring|summer|autumn|fall|winter)(?:\s+of)?(?:\s+" + _YEAR + r")?\b", _season),
    (r"\b" + _NUM + r"\s+" + _UNIT + r"\s+ago\b", _ago),
    (r"\b(?:(?:in|over|during|for)\s+)?(?:the\s+)?(?:past|last|previous)\s+" + _NUM + r"\s+" + _UNIT
     + r"\b", _past_n),
    (r"\b(?P<word>recently|lately|the\s+other\s+day)\b", _soft),
    (r"\b(?:(?P<which>in|during|of|last|this)\s+(?:the\s+month\s+of\s+)?)?" + _MON
     + r"(?:,?\s+" + _YEAR + r")?\b(?!['’]s)", _month),
    (r"\b" + _ON + _MON + r"\s+" + _DAY + r"(?:,?\s+" + _YEAR + r")?\b", _month_day),
    (r"\b" + _ON + _DAY + r"\s+(?P<of>of\s+)?" + _MON + r"(?:,?\s+" + _YEAR + r")?\b", _day_month),
    (r"\b" + _ON + r"(?P<year>\d{4})-(?P<mm>\d\d)-(?P<day>\d\d)(?!\d)", _iso),
    (r"\b(?:in|during|of)\s+" + _YEAR + r"\b(?!-)", _year),
]]


# Indexes into _RULES, by the words a phrase of each rule must hold (a four-digit number too:
# _digits). Every phrase holds one, so the rules run only on the text around these words.
_REL, _CAL, _WD, _SEA, _AGO, _PAST, _SOFT, _MONTH, _MDAY, _DMON, _ISO, _YR = range(len(_RULES))
_UNITS = (_CAL, _AGO, _PAST)
_ANCHORS: dict[str, tuple[int, ...]] = {
    **dict.fromkeys(("yesterday", "today", "tonight", "morning", "afternoon", "evening"), (_REL,)),
    **dict.fromkeys(("night", "nights"), (_REL, *_UNITS)),
    **dict.fromkeys(("day", "days"), (_AGO, _PAST, _SOFT)),
    **dict.fromkeys(("week", "weeks", "weekend", "weekends", "month", "months", "year", "years"),
                    _UNITS),
    **dict.fromkeys(_WEEKDAYS, (_WD,)),
    **dict.fromkeys(_SEASONS, (_SEA,)),
    **dict.fromkeys(("recently", "lately"), (_SOFT,)),
    **dict.fromkeys(_MONTHS, (_MONTH, _MDAY, _DMON)),
}
# a four-digit word: "2023-05-01", "in 2023" (a month or season names its own)
_DIGITS = (_ISO, _YR)
_WORD = re.compile(r"[^\W\d_]+|\d+")
# How far before the word it is found by a phrase may start ("during the previous couple of
# weeks", "the day before yesterday"); one with longer runs of spaces there is missed.
_BEFORE = 48
# The words looked at around, at most, in one question: past them no phrase is looked for, so
# a question made of such words costs as much as one that has a phrase early. A missed phrase
# only ranks the answer lower (see the module docstring).
MAX_TIME_WORDS = 32


def find_time_window(text: str, now: datetime) -> TimeWindow | None:
    """The window meant by the leftmost (then longest) time phrase in ``text``, or None.

    Linear in ``text``: one pass over its words, and the rules are tried only at the word
    starts just before each of the first :data:`MAX_TIME_WORDS` words a phrase must hold,
    up to the first phrase found (a phrase starting later cannot win).
    """
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be timezone-aware")
    lowered = text.lower()
    same = len(lowered) == len(text)  # a few characters lower to two ("İ"): then word by word
    source = lowered if same else text
    present = {w if same else w.lower() for w in _WORD.findall(source)}
    if present.isdisjoint(_ANCHORS) and not any(len(w) == 4 and w.isdigit() for w in present):
        return None  # most questions: no word a phrase needs
    best: tuple[int, int, _Raw] | None = None
    starts: deque[int] = deque()  # the word starts within _BEFORE of the current word
    looked = 0
    for word in _WORD.finditer(source):
        at = word.start()
        if best is not None and at - _BEFORE > best[0]:
            break
        starts.append(at)
        while starts[0] < at - _BEFORE:
            starts.popleft()
        key = word.group() if same else word.group().lower()
        rules = _ANCHORS.get(key) or (_DIGITS if len(key) == 4 and key.isdigit() else None)
        if rules is None:
            continue
        looked += 1
        if looked > MAX_TIME_WORDS:
            break
        for index in rules:
            hit = _first_phrase(index, text, starts, now)
            if hit is not None and (best is None or (hit[0], -hit[1]) < (best[0], -best[1])):
                best = hit
    if best is None:
        return None
    start, end, (lo, hi, exact) = best
    return TimeWindow(_ms(lo), _ms(min(hi, now)), text[start:end], exact, (start, end))


def _first_phrase(index: int, text: str, starts: Iterable[int],
                  now: datetime) -> tuple[int, int, _Raw] | None:
    """The first phrase of rule ``index`` at one of ``starts`` that names a past window."""
    pattern, resolve = _RULES[index]
    for at in starts:
        m = pattern.match(text, at)
        if m is None:
            continue
        raw = resolve(m, now)
        # A window in the future says nothing of memory; compare in ms, the unit of the
        # result, so "today" asked in the first millisecond of a day is not an empty window.
        if raw is not None and _ms(raw[0]) < _ms(now):
            return m.start(), m.end(), raw
    return None


def strip_time_phrase(text: str, window: TimeWindow) -> str:
    """``text`` without the window's phrase, spaces tidied, for the keyword leg of search."""
    start, end = window.span
    if text[start:end] != window.phrase:  # not the text the window came from: find it again
        start = text.lower().find(window.phrase.lower())
        if start < 0:
            return text
        end = start + len(window.phrase)
    joined = text[:start].rstrip() + " " + text[end:].lstrip()
    return re.sub(r"\s+([?.!,;:])", r"\1", joined).strip(" ,")


def _ms(dt: datetime) -> int:
    return (dt - _EPOCH) // timedelta(milliseconds=1)
