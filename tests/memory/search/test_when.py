"""The time a query names (issue 25, point 5): read as spans of days relative to the request's
day, and nothing for a query that names none."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from app.memory.learning.dates import absolute_dates
from app.memory.search.when import in_time, times
from app.memory.search.windows import Window

TODAY = date(2026, 11, 24)  # a Tuesday


def span(start: str, end: str) -> Window:
    return Window(date.fromisoformat(start), date.fromisoformat(end))


@pytest.mark.parametrize(
    ("query", "windows"),
    [
        ("What did I do last May?", [span("2026-05-01", "2026-06-01")]),
        ("what did i do last may", [span("2026-05-01", "2026-06-01")]),
        ("What did I do last November?", [span("2025-11-01", "2025-12-01")]),
        ("What did I do in 2023?", [span("2023-01-01", "2024-01-01")]),
        ("Which hobby did I take up in March 2024?", [span("2024-03-01", "2024-04-01")]),
        ("What hobby did Sam take up in May 2023?", [span("2023-05-01", "2023-06-01")]),
        ("Which classes did Evan join in mid-August 2023?", [span("2023-08-01", "2023-09-01")]),
        ("What did I start two weeks ago?", [span("2026-11-07", "2026-11-14")]),
        ("What did I eat yesterday?", [span("2026-11-23", "2026-11-24")]),
        ("What did I do the day before yesterday?", [span("2026-11-22", "2026-11-23")]),
        ("What happened last week?", [span("2026-11-16", "2026-11-23")]),
        ("What happened this month?", [span("2026-11-01", "2026-12-01")]),
        ("Where did I travel last year?", [span("2025-01-01", "2026-01-01")]),
        ("What did I read in the past two weeks?", [span("2026-11-10", "2026-11-25")]),
        ("What did I do in the last year?", [span("2025-11-24", "2026-11-25")]),
        ("What did I do on 7 May?", [span("2026-05-07", "2026-05-08")]),  # the past one
        ("What is on 3 December?", [span("2026-12-03", "2026-12-04")]),  # the coming one
        ("What did Sam do on December 4, 2023?", [span("2023-12-04", "2023-12-05")]),
        ("What did Evan share on 9th December 2023?", [span("2023-12-09", "2023-12-10")]),
        ("What did I do on 2023-10-13?", [span("2023-10-13", "2023-10-14")]),
        ("What did I do in May 2023?", [span("2023-05-01", "2023-06-01")]),
        ("Where did we go last summer?", [span("2026-06-01", "2026-09-01")]),
        ("What happened towards the end of summer 2023?", [span("2023-06-01", "2023-09-01")]),
        ("Where was I last weekend?", [span("2026-11-21", "2026-11-23")]),
        ("What did I do last Friday?", [span("2026-11-20", "2026-11-21")]),
        ("What do I have next Friday?", [span("2026-11-27", "2026-12-05")]),  # either Friday
        ("What did I do a month ago?", [span("2026-10-01", "2026-11-01")]),
        ("What is due in 3 days?", [span("2026-11-26", "2026-11-29")]),
        ("What painting did I share in October?", [span("2026-10-01", "2026-11-01")]),
    ],
)  # fmt: skip
def test_the_time_a_query_names(query: str, windows: list[Window]) -> None:
    assert list(times(query, TODAY)) == windows


@pytest.mark.parametrize(
    "query",
    [
        "What should I cook tonight? I may want pasta",  # "tonight" is a time: see below
        "What should I cook?",
        "Which recipes do I like?",
        "How many calories are in 2000 grams of rice?",
        "Who is April?",
        "I may go to the march",
        "What is my daughter's name",
        "",
    ],
)
def test_a_query_that_names_no_time_gives_none(query: str) -> None:
    expected = [span("2026-11-24", "2026-11-25")] if "tonight" in query else []
    assert list(times(query, TODAY)) == expected


def test_a_memory_belongs_by_when_it_was_said_or_the_day_its_text_names() -> None:
    may = [span("2026-05-01", "2026-06-01")]
    assert in_time(may, datetime(2026, 5, 16, 23, tzinfo=UTC), "Went hiking in the Alps")
    assert not in_time(may, datetime(2026, 6, 2, tzinfo=UTC), "Went hiking in the Alps")
    assert in_time(may, datetime(2026, 6, 2, tzinfo=UTC), "Went hiking on 30 May 2026")
    # an episode's own relative words are read from the day it was said
    assert in_time(may, datetime(2026, 6, 20, tzinfo=UTC), "I went hiking last month")
    assert not in_time(may, datetime(2026, 8, 20, tzinfo=UTC), "I went hiking last month")


@pytest.mark.parametrize(
    "written",
    ["Went hiking yesterday", "Has an exam next week", "Quit smoking last month",
     "Moved to Berlin two weeks ago", "Visited Rome last May", "Plans to retire next year",
     "Went camping last weekend", "Is cooking pasta tonight"],
)  # fmt: skip
def test_what_the_manager_s_dates_are_written_as_is_read_back_as_the_same_time(
    written: str,
) -> None:
    """The two rules agree: the absolute text of a relative date names the time the relative
    words name."""
    said = datetime(2026, 11, 24, 15, tzinfo=UTC)
    rewritten = absolute_dates(written, said)
    assert rewritten != written
    assert times(rewritten, date(2030, 1, 1)) == times(written, TODAY)
