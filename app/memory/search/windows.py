"""Spans of days, and the calendar words that name them: the arithmetic the time rules share.

What the Manager's memories are rewritten with (:mod:`app.memory.learning.dates`) and what a
query's time is read from (:mod:`app.memory.search.when`) use these same words and this one
format, so that what one writes the other reads:

- a day is written ``24 November 2026`` (:func:`day_text`): the month as a word (a query says
  "November", and BM25 finds the word; ``2026-11-24`` gives it only numbers), day first as
  LoCoMo's gold answers write it ("7 May 2023"), never ``11/24``, which reads two ways;
- a month ``November 2026``, a year ``2026``;
- every day is a UTC day: the jobs' and the requests' clocks are UTC, and a user's time zone is
  not known (a user at 23:30 in UTC-5 is already on tomorrow's date here).

Weeks are ISO weeks, Monday to Sunday; seasons are the northern meteorological ones (spring is
March to May, summer June to August, autumn September to November, winter December to February).
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

MONTHS = tuple(calendar.month_name)[1:]
"""January .. December."""
WEEKDAYS = tuple(calendar.day_name)
"""Monday .. Sunday (``date.weekday()`` indexes it)."""
MONTH_NUMBERS = {name.lower(): i for i, name in enumerate(MONTHS, start=1)} | {
    name.lower()[:3]: i for i, name in enumerate(MONTHS, start=1)
} | {"sept": 9}  # fmt: skip
"""Month names and their three-letter abbreviations (lower case) -> 1..12."""
NUMBER_WORDS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "fifteen": 15, "twenty": 20,
    "thirty": 30,
}  # fmt: skip
"""The counts a relative date may be said with ("two weeks ago", "a month ago")."""
SEASONS = {"spring": 3, "summer": 6, "autumn": 9, "fall": 9, "winter": 12}
"""A season -> the month it begins in (northern, meteorological: three months each)."""

MONTH_PATTERN = "|".join(m.lower() for m in MONTHS)
WEEKDAY_PATTERN = "|".join(d.lower() for d in WEEKDAYS)
NUMBER_PATTERN = r"\d{1,3}|" + "|".join(NUMBER_WORDS)


@dataclass(frozen=True, slots=True, order=True)
class Window:
    """The days from `start` up to, not including, `end`."""

    start: date
    end: date

    def holds(self, day: date) -> bool:
        return self.start <= day < self.end

    def meets(self, other: Window) -> bool:
        """Whether the two share a day."""
        return self.start < other.end and other.start < self.end


def utc_day(moment: datetime) -> date:
    """The UTC date of `moment` (naive: taken as UTC)."""
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(UTC).date()


def count(word: str) -> int:
    """A count said as digits or as a word ("2", "two", "a")."""
    return int(word) if word.isdigit() else NUMBER_WORDS[word.lower()]


def shift_month(year: int, month: int, by: int) -> tuple[int, int]:
    """The month `by` months after (before, when negative) `month` of `year`."""
    index = year * 12 + month - 1 + by
    return index // 12, index % 12 + 1


def one_day(day: date) -> Window:
    return Window(day, day + timedelta(days=1))


def one_month(year: int, month: int) -> Window:
    after = shift_month(year, month, 1)
    return Window(date(year, month, 1), date(after[0], after[1], 1))


def one_year(year: int) -> Window:
    return Window(date(year, 1, 1), date(year + 1, 1, 1))


def season(name: str, year: int) -> Window:
    """The season `name` that begins in `year` (winter 2023: December 2023 to February 2024)."""
    first = SEASONS[name.lower()]
    after = shift_month(year, first, 3)
    return Window(date(year, first, 1), date(after[0], after[1], 1))


def monday(day: date) -> date:
    """The Monday of `day`'s ISO week."""
    return day - timedelta(days=day.weekday())


def day_text(day: date) -> str:
    """``24 November 2026``: how a rewritten memory names a day (the module docstring)."""
    return f"{day.day} {MONTHS[day.month - 1]} {day.year}"


def month_text(year: int, month: int) -> str:
    return f"{MONTHS[month - 1]} {year}"


def valid_day(year: int, month: int, day: int) -> date | None:
    """The date, or None when there is no such day (31 April, 29 February 2025)."""
    try:
        return date(year, month, day)
    except ValueError:
        return None
