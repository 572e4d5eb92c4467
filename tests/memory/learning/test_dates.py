"""The rule after the Manager (issue 25, point 5): relative dates in a memory it writes become
absolute dates of the day the job was said, never of the day the test runs; what could be read
two ways, quotations, names and titles stay as written."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from app.memory.learning.dates import absolute_dates

TUESDAY = datetime(2026, 11, 24, 15, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("written", "stored"),
    [
        ("Went hiking yesterday", "Went hiking on 23 November 2026"),
        ("Yesterday went hiking with Mia", "On 23 November 2026 went hiking with Mia"),
        ("Has a dentist appointment tomorrow morning",
         "Has a dentist appointment on the morning of 25 November 2026"),
        ("Is cooking pasta tonight", "Is cooking pasta on the night of 24 November 2026"),
        ("Got engaged last night", "Got engaged on the night of 23 November 2026"),
        ("Today is her birthday", "24 November 2026 is her birthday"),
        ("The day after tomorrow is her birthday", "26 November 2026 is her birthday"),
        ("Went to the gym last Wednesday", "Went to the gym on 18 November 2026"),
        ("Went to a concert last Friday", "Went to a concert on 20 November 2026"),
        ("Has a meeting next Monday", "Has a meeting on 30 November 2026"),
        ("Has a meeting next Tuesday", "Has a meeting on 1 December 2026"),
        ("Visits her mum this Sunday", "Visits her mum on 29 November 2026"),
        ("Has an exam next week", "Has an exam in the week of 30 November 2026"),
        ("Was ill last week", "Was ill in the week of 16 November 2026"),
        ("Quit smoking this month", "Quit smoking in November 2026"),
        ("Started pottery last month", "Started pottery in October 2026"),
        ("Moves to Lyon next month", "Moves to Lyon in December 2026"),
        ("Since last year, lives in Lyon", "Since 2025, lives in Lyon"),
        ("Last year was hard", "2025 was hard"),
        ("Spent last year in Spain", "Spent 2025 in Spain"),
        ("Plans to retire next year", "Plans to retire in 2027"),
        ("Goes camping this weekend", "Goes camping on the weekend of 28 November 2026"),
        ("Went camping last weekend", "Went camping on the weekend of 21 November 2026"),
        ("Visited Rome last May", "Visited Rome in May 2026"),
        ("Visited Rome last November", "Visited Rome in November 2025"),
        ("Plans to visit Rome next March", "Plans to visit Rome in March 2027"),
        ("Moved to Berlin 3 days ago", "Moved to Berlin on 21 November 2026"),
        ("Moved to Berlin two weeks ago", "Moved to Berlin around 10 November 2026"),
        ("Started a new job a month ago", "Started a new job around October 2026"),
        ("Moved to Oslo five years ago", "Moved to Oslo around 2021"),
        ("Starts school in 3 days", "Starts school on 27 November 2026"),
        ("Moves to Berlin in two weeks", "Moves to Berlin around 8 December 2026"),
        ("Is getting married in two months", "Is getting married around January 2027"),
        ("Went to the gym last week and today",
         "Went to the gym in the week of 16 November 2026 and on 24 November 2026"),
        ("I have a dentist appointment tomorrow", "I have a dentist appointment on 25 November 2026"),
        ("- Yesterday went hiking", "- On 23 November 2026 went hiking"),
    ],
)  # fmt: skip
def test_relative_dates_are_written_from_the_day_it_was_said(written: str, stored: str) -> None:
    assert absolute_dates(written, TUESDAY) == stored


@pytest.mark.parametrize(
    "written",
    [
        "Has a meeting next Friday",  # on a Tuesday: this week's Friday, or next week's?
        "Mia's party is next Saturday",
        "Goes camping next weekend",  # before Saturday: the coming weekend or the one after?
        "Plans to visit Rome next December",  # in November: this December or next year's?
        "Has been tired in the last week",  # the past seven days, not a calendar week
        "Reads more than in the last year",
        "Lost 3 kg in two weeks",  # how long it took, not when
        "Finished the book in 3 days",
        "Runs three times in a week",
        "Reads a book in a day",  # a habit's pace: nothing marks what is to come
        "Usually finishes a puzzle in two days",
        "Enjoyed yesterday's concert",
        'Said "see you tomorrow" to Mia',
        "Her motto is “live as if you die tomorrow”",
        "Went hiking yesterday (23 November)",
        "Visited Rome last May 2023",
        "Watched Tomorrow Never Dies",
        "Tomorrow Never Dies is her favourite film",
        "Saw The Day After Tomorrow twice",
        "Loves the film Next Friday",
        "Moved to Berlin on 3 May 2024",
        "Lives in Lyon",
        "Has a cat called Tomorrow",
    ],
)
def test_what_could_be_read_two_ways_and_names_stay_as_written(written: str) -> None:
    assert absolute_dates(written, TUESDAY) == written


@pytest.mark.parametrize(
    ("said", "written", "stored"),
    [
        # week boundaries: Sunday and Monday, ISO weeks
        (datetime(2026, 11, 29, 12, tzinfo=UTC), "Ran last Sunday", "Ran on 22 November 2026"),
        (datetime(2026, 11, 29, 12, tzinfo=UTC), "Ran last Monday", "Ran last Monday"),  # 6 or 13 days?
        (datetime(2026, 11, 29, 12, tzinfo=UTC), "Runs next Monday", "Runs on 30 November 2026"),
        (datetime(2026, 11, 30, 12, tzinfo=UTC), "Ran last Sunday", "Ran on 29 November 2026"),
        (datetime(2026, 11, 30, 12, tzinfo=UTC), "Ran last week",
         "Ran in the week of 23 November 2026"),
        (datetime(2026, 11, 29, 12, tzinfo=UTC), "Went camping last weekend",
         "Went camping on the weekend of 21 November 2026"),
        (datetime(2026, 11, 28, 12, tzinfo=UTC), "Goes camping next weekend",
         "Goes camping on the weekend of 5 December 2026"),
        (datetime(2026, 11, 28, 12, tzinfo=UTC), "Goes camping this weekend",
         "Goes camping on the weekend of 28 November 2026"),
        # month and year ends
        (datetime(2026, 3, 1, 8, tzinfo=UTC), "Went hiking yesterday", "Went hiking on 28 February 2026"),
        (datetime(2024, 3, 1, 8, tzinfo=UTC), "Went hiking yesterday", "Went hiking on 29 February 2024"),
        (datetime(2024, 2, 28, 8, tzinfo=UTC), "Flies tomorrow", "Flies on 29 February 2024"),
        (datetime(2026, 12, 31, 8, tzinfo=UTC), "Flies tomorrow", "Flies on 1 January 2027"),
        (datetime(2027, 1, 1, 8, tzinfo=UTC), "Quit smoking last month", "Quit smoking in December 2026"),
        (datetime(2026, 12, 15, 8, tzinfo=UTC), "Moves next month", "Moves in January 2027"),
        (datetime(2026, 3, 31, 8, tzinfo=UTC), "Started a new job a month ago",
         "Started a new job around February 2026"),
        (datetime(2024, 3, 10, 8, tzinfo=UTC), "Moved 10 days ago", "Moved on 29 February 2024"),
        (datetime(2026, 1, 5, 8, tzinfo=UTC), "Visited Rome last December", "Visited Rome in December 2025"),
        (datetime(2026, 1, 5, 8, tzinfo=UTC), "Visits Rome next January", "Visits Rome in January 2027"),
        # the day is the UTC day of the job's time, whatever zone it was given in
        (datetime(2026, 11, 24, 23, 30, tzinfo=timezone(timedelta(hours=-5))),
         "Went hiking yesterday", "Went hiking on 24 November 2026"),
        (datetime(2026, 11, 24, 1, 0, tzinfo=timezone(timedelta(hours=2))),
         "Went hiking yesterday", "Went hiking on 22 November 2026"),
    ],
)  # fmt: skip
def test_calendar_edges(said: datetime, written: str, stored: str) -> None:
    assert absolute_dates(written, said) == stored
