"""Relative dates in what the Manager writes, made absolute by rule from the day it was said.

The Manager is told the job's date and to write absolute dates; small models still write
"yesterday". :func:`absolute_dates` is the check after the model: each NEW and UPDATE text is
rewritten from the job's date (``created_at``, the chat's time, in UTC) before it is stored, so
a memory says "Went hiking on 23 November 2026", true whenever it is read, and a query for
"November 2026" finds it by its words. Days are written ``23 November 2026``
(:func:`~app.memory.search.windows.day_text` says why), and the text keeps its shape: the
expression is replaced by one that reads in its place ("since last year" -> "since 2025",
"Last year was hard" -> "2025 was hard").

Promises:

- rewritten (from a job said on Tuesday 24 November 2026): "yesterday" (23 November 2026),
  "today", "tomorrow", "tonight", "last night", "this morning", "tomorrow evening", "the day
  before yesterday"; "last/this/next week" ("in the week of 16 November 2026", its Monday);
  "last/this/next month" ("in October 2026"), "last/this/next year" ("in 2025"); "this/last
  weekend" ("on the weekend of 21 November 2026", its Saturday); "last Friday", "next Monday",
  "this Sunday", "last May" (the latest May before this month: May 2026), "next March" (March
  2027), "this May"; "3 days ago" (a day), "two weeks ago" ("around 10 November 2026"), "a
  month ago" ("around October 2026"), "5 years ago" ("around 2021"); "in 3 days", "in two
  weeks";
- left as written whenever a reading is in doubt: "next Friday" said on a Monday (this week's
  or next week's?), "last Friday" said on a Saturday, "next weekend" before Saturday, "next
  May" said before May, "the last week" (the past seven days, not a calendar week), "in two
  weeks" beside a count or a past tense ("Lost 3 kg in two weeks", "Finished it in 2 days",
  "three times in a week"), a possessive ("yesterday's concert"), an expression already given
  a date ("yesterday (23 November)", "last May 2023");
- never rewritten: words inside quotation marks, and names and titles: an expression with a
  capitalised word in mid-sentence ("Watched Tomorrow Never Dies", "loves Next Friday"), or at
  the start of a sentence followed by a capitalised word ("Yesterday Once More is her song");
  absolute dates, of course;
- the date is the UTC day of the job's time: a user at 23:30 in UTC-5 writes on their
  tomorrow. Weeks are ISO weeks (Monday to Sunday).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import date, datetime, timedelta

from app.memory.search.windows import (
    MONTH_NUMBERS,
    MONTH_PATTERN,
    NUMBER_PATTERN,
    NUMBER_WORDS,
    WEEKDAY_PATTERN,
    WEEKDAYS,
    count,
    day_text,
    monday,
    month_text,
    shift_month,
    utc_day,
)

_Reading = tuple[str, str]
"""What an expression becomes: (in a place of its own: "on 23 November 2026", after a
preposition or as a noun: "23 November 2026")."""


def absolute_dates(text: str, said: datetime) -> str:
    """`text` with its relative dates written from `said` (the module docstring)."""
    if not _CLUE.search(text):
        return text
    today = utc_day(said)
    guarded = [m.span() for m in _QUOTED.finditer(text)]
    out, taken = [], 0
    for match in sorted(_matches(text), key=lambda m: m.start()):
        start, end = match.span()
        if start < taken or any(a <= start < b for a, b in guarded) or not _plain(text, match):
            continue
        reading = _READERS[match.re](match, today, text)
        if reading is None:
            continue
        out += [text[taken:start], _placed(text, match, reading)]
        taken = end
    return "".join([*out, text[taken:]])


def _matches(text: str) -> list[re.Match[str]]:
    """Every expression's match, the earlier pattern first where two overlap."""
    found: list[re.Match[str]] = []
    for pattern in _READERS:
        fresh = [m for m in pattern.finditer(text) if not _overlaps(m, found)]
        found += fresh
    return found


def _overlaps(match: re.Match[str], others: list[re.Match[str]]) -> bool:
    return any(match.start() < o.end() and o.start() < match.end() for o in others)


def _plain(text: str, match: re.Match[str]) -> bool:
    """Not a name or a title, not possessive, not already given a date (the module docstring)."""
    after = text[match.end() :]
    if _POSSESSIVE.match(after) or _DATED_AFTER.match(after):
        return False
    opening = _sentence_start(text, match.start())
    for i, word in enumerate(match.group(0).split()):
        if word[0].isupper() and word.lower() not in _CALENDAR and not (i == 0 and opening):
            return False
    following = _NEXT_WORD.match(after)
    return not (
        opening
        and match.group(0)[0].isupper()
        and following is not None
        and following.group(1)[0].isupper()
        and following.group(1).lower() not in _CALENDAR | {"i"}
    )


def _sentence_start(text: str, at: int) -> bool:
    return _OPENING.search(text[:at]) is not None


def _placed(text: str, match: re.Match[str], reading: _Reading) -> str:
    """The reading that fits where the expression stood, capitalised at a sentence start."""
    before = _PREVIOUS_WORD.search(text[: match.start()])
    word = before.group(1).lower() if before else ""
    noun = word in _PREPOSITIONS or word in _SPENDING or bool(_SUBJECT.match(text[match.end() :]))
    placed = reading[1] if noun else reading[0]
    if match.group(0)[0].isupper() and _sentence_start(text, match.start()):
        placed = placed[0].upper() + placed[1:]
    return placed


def _on(day: date, part: str | None = None) -> _Reading:
    bare = f"the {part} of {day_text(day)}" if part else day_text(day)
    return f"on {bare}", bare


def _near(day: date) -> _Reading:
    return f"around {day_text(day)}", f"around {day_text(day)}"


def _named_day(match: re.Match[str], today: date, text: str) -> _Reading | None:
    words = " ".join(match.group(0).lower().split())
    offsets = {"the day before yesterday": -2, "the day after tomorrow": 2, "yesterday": -1,
               "last night": -1, "tomorrow": 1}  # fmt: skip
    head = next((k for k in offsets if words.startswith(k)), "")
    named = match.groupdict()
    part = named.get("part") or named.get("part2")
    part = part or ("night" if words in ("tonight", "last night") else None)
    return _on(today + timedelta(days=offsets.get(head, 0)), part and part.lower())


def _weekday(match: re.Match[str], today: date, text: str) -> _Reading | None:
    """Written only when every reading agrees: the nearest such day before (after) today, and
    that day of the ISO week before (after); "this": of this week, and the coming one."""
    which, wanted = match.group("which").lower(), WEEKDAYS.index(match.group("wd").title())
    weekday, this_week = today.weekday(), monday(today) + timedelta(days=wanted)
    if which == "last":
        readings = {today - timedelta(days=(weekday - wanted - 1) % 7 + 1),
                    this_week - timedelta(days=7)}  # fmt: skip
    elif which == "next":
        readings = {today + timedelta(days=(wanted - weekday - 1) % 7 + 1),
                    this_week + timedelta(days=7)}  # fmt: skip
    else:
        readings = {this_week, today + timedelta(days=(wanted - weekday) % 7)}
    return _on(readings.pop()) if len(readings) == 1 else None


def _span(match: re.Match[str], today: date, text: str) -> _Reading | None:
    """ "last week", "this month", "next year", "this weekend"."""
    which, span = match.group("which").lower(), match.group("span").lower()
    step = {"last": -1, "this": 0, "next": 1}[which]
    if span == "year":
        return f"in {today.year + step}", str(today.year + step)
    if span == "month":
        return _month(*shift_month(today.year, today.month, step))
    if span == "week":  # named by its Monday: "the week before 24 November" would read two ways
        start = monday(today) + timedelta(days=7 * step)
        return f"in the week of {day_text(start)}", f"the week of {day_text(start)}"
    saturday = monday(today) + timedelta(days=5)
    if which == "last":
        saturday -= timedelta(days=7)
    elif which == "next":
        if today.weekday() < 5:  # before Saturday: the coming weekend, or the one after?
            return None
        saturday += timedelta(days=7)
    bare = f"the weekend of {day_text(saturday)}"
    return f"on {bare}", bare


def _month(year: int, month: int) -> _Reading:
    return f"in {month_text(year, month)}", month_text(year, month)


def _month_named(match: re.Match[str], today: date, text: str) -> _Reading | None:
    which, month = match.group("which").lower(), MONTH_NUMBERS[match.group("mon").lower()]
    if which == "last":
        return _month(today.year - (month >= today.month), month)
    if which == "this":
        return _month(today.year, month)
    return _month(today.year + 1, month) if month <= today.month else None


def _counted(match: re.Match[str], today: date, text: str) -> _Reading | None:
    """ "3 days ago", "in two weeks" (not when it may be a duration: the module docstring)."""
    n, unit = count(match.group("n")), match.group("unit").lower()
    ahead = match.group(0).lower().startswith("in")
    if n > _MOST[unit] or (ahead and not _future(text, match.start())):
        return None
    n = n if ahead else -n
    if unit == "day":
        return _on(today + timedelta(days=n))
    if unit == "week":
        return _near(today + timedelta(weeks=n))
    if unit == "month":
        text_ = month_text(*shift_month(today.year, today.month, n))
        return f"around {text_}", f"around {text_}"
    return f"around {today.year + n}", f"around {today.year + n}"


def _future(text: str, at: int) -> bool:
    """Whether "in N units" at `at` says when something will be: its clause names what is to
    come ("will", "is moving", "has an exam") and it may not be how long something takes
    ("Reads a book in a day", "Lost 3 kg in two weeks": :func:`_duration`)."""
    clause = _CLAUSE.split(text[:at])[-1] + " " + _CLAUSE.split(text[at:])[0]
    words = set(_WORDS.findall(clause.lower()))
    return bool(words & _AHEAD) and not _duration(text, at)


_AHEAD = frozenset(
    "will ll going gonna plan plans planning planned due scheduled appointment starts start "
    "starting begins begin leaves leaving arrives arriving moving move moves flying flies "
    "travelling traveling visiting visit coming comes returns returning expects expecting "
    "hopes hoping wants trip wedding birthday exam exams interview deadline surgery holiday "
    "holidays vacation party concert flight getting married marrying graduating graduates "
    "retiring retires baby".split()
)


def _duration(text: str, at: int) -> bool:
    """Whether "in N units" at `at` may be how long something took, not when it will be."""
    clause = _CLAUSE.split(text[:at])[-1]
    counted = any(w.isdigit() or (w in NUMBER_WORDS and w not in ("a", "an"))
                  for w in _WORDS.findall(clause.lower()))  # fmt: skip
    words = _WORDS.findall((clause + _CLAUSE.split(text[at:])[0]).lower())
    past = any(
        (w in _PAST_TENSE or (len(w) > 4 and w.endswith("ed") and w not in _NOT_PAST))
        and (i == 0 or words[i - 1] not in _LINKING)  # "Is excited", "getting married": not past
        for i, w in enumerate(words)
    )
    return counted or past or bool(_PER.search(clause))


_MOST = {"day": 366, "week": 104, "month": 60, "year": 100}
_CALENDAR = {m.lower() for m in MONTH_NUMBERS} | {d.lower() for d in WEEKDAYS}
_PREPOSITIONS = frozenset(
    "since until till by before after from to on in for of at around between through during "
    "throughout about".split()
)
_SPENDING = frozenset("spend spends spent spending".split())
_PAST_TENSE = frozenset(
    "was were had did lost ran took made got went wrote won built grew paid spent saw gave "
    "came became found left kept sold bought taught thought brought caught fell felt drove "
    "flew swam began".split()
)
_NOT_PAST = frozenset("indeed hundred proceed exceed succeed speed breed bleed embed".split())
_LINKING = frozenset("is are am be been being get gets getting feel feels seem seems".split())
_PER = re.compile(r"\b(?:times|once|twice|thrice|per|every)\s+(?:\w+\s+)?$", re.IGNORECASE)
_CLAUSE = re.compile(r"[.;!?,:()\n]")
_WORDS = re.compile(r"[\w']+")
_CLUE = re.compile(r"\b(?:yesterday|today|tonight|tomorrow|last|next|this|ago|in)\b", re.IGNORECASE)
_QUOTED = re.compile(r"\"[^\"]*\"|“[^”]*”|‘[^’]*’|(?<!\w)'[^'\n]+'(?!\w)")
_POSSESSIVE = re.compile(r"['’]s\b")
_DATED_AFTER = re.compile(
    rf"\s*[,(]?\s*(?:on\s+|the\s+)?(?:\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?(?:{MONTH_PATTERN})"
    rf"|(?:{MONTH_PATTERN})\s+\d|\d{{4}}|\d{{1,2}}[/.-]\d)",
    re.IGNORECASE,
)
_OPENING = re.compile(r"(?:^|[.!?;:]\s+|\n\s*|^\s*[-*•]\s+|\(\s*)$")
_NEXT_WORD = re.compile(r"\s+([\w][\w'-]*)")
_PREVIOUS_WORD = re.compile(r"([\w']+)\s+$")
_SUBJECT = re.compile(r"\s+(?:is|was|will|would|has|had|marks|means)\b", re.IGNORECASE)
_NOT_THE = r"(?<!\bthe\s)(?<!\bthe\s\s)(?<!\bevery\s)"


def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE)


_Reader = Callable[[re.Match[str], date, str], _Reading | None]
_READERS: dict[re.Pattern[str], _Reader] = {
    _compile(r"\bthe\s+day\s+(?:before\s+yesterday|after\s+tomorrow)\b"): _named_day,
    _compile(r"\b(?:(?:yesterday|tomorrow|today)(?:\s+(?P<part>morning|afternoon|evening|night))?"
             r"|tonight|last\s+night|this\s+(?P<part2>morning|afternoon|evening))\b"): _named_day,
    _compile(rf"{_NOT_THE}\b(?P<which>last|next|this)\s+(?P<wd>{WEEKDAY_PATTERN})\b"): _weekday,
    _compile(rf"{_NOT_THE}\b(?P<which>last|next|this)\s+(?P<span>week(?:end)?|month|year)\b"):
        _span,
    _compile(rf"{_NOT_THE}\b(?P<which>last|next|this)\s+(?P<mon>{MONTH_PATTERN})\b(?!\s*\d)"):
        _month_named,
    _compile(rf"\b(?P<n>{NUMBER_PATTERN})\s+(?P<unit>day|week|month|year)s?\s+ago\b"): _counted,
    _compile(rf"\bin\s+(?P<n>{NUMBER_PATTERN})\s+(?P<unit>day|week|month|year)s?\b"): _counted,
}  # fmt: skip
