"""The time a query names, and whether a memory was said or is dated then.

Promises:

- :func:`times` reads the times a text names as spans of UTC days, relative to `today` when
  relative: "yesterday", "last week" (the ISO week before), "this month", "last year",
  "two weeks ago" (those days, give or take three), "in 3 days", "the past month" (up to today),
  "last Friday" (every day it can mean), "last May" (the latest May before this month),
  "last summer", "this weekend"; and absolute: "in 2023", "May 2023", "mid-August 2023",
  "on 7 May 2023", "October 13, 2023", "2023-10-13", "summer 2023", "the week of 16 November
  2026", "around 10 November 2026". A day or month without a year ("on 7 May", "in October")
  is its occurrence nearest to `today`, the future counted twice as far
  (:mod:`app.memory.search.time_readers`). Each part of the text is read once: "in March 2024"
  is March 2024, not also all of 2024. What the Manager's memories are rewritten with
  (:mod:`app.memory.learning.dates`) is read back as the time it stands for;
- a text that names no time gives nothing, and then recall ranks exactly as without this rule
  (:mod:`app.memory.search.ranking` adds :data:`TIME_BONUS` only to memories :func:`in_time`);
- :func:`in_time` says whether a memory belongs to a query's times: said on one of their days
  (``observed_at``), or naming a day in them in its text, read by the same rules with the
  memory's own date as `today` (an episode's "last May" is the May before it was said).

What it does not read: names of holidays, "recently", "a few weeks ago", times of day, ranges
("from May to July" is May and July), anything not in English. "may", "march", "sat" are months
or days only beside a day, a year, or a preposition that makes them one ("in may").
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import date, datetime

from app.memory.search.time_readers import CLUE, READERS, TOKEN
from app.memory.search.windows import Window, utc_day

TIME_BONUS = 0.1
"""Added to the fused score (:mod:`app.memory.search.ranking`) of a memory that belongs to the
times a query names (:func:`in_time`), the sum capped at 1. Measured on the LoCoMo dev
conversations (``bench/recall_eval.py``, 39 of 306 questions name a time, the turns carry their
session's date): recall@5/@10 of those questions .598/.739 without it; +0.02: .611/.774; +0.05
and +0.1: .645/.774; +0.15 and +0.2: .645/.748; +0.3: .620/.748; x1.25 instead: .645/.774. Of
all 306, .594/.726 -> .600/.730. Added rather than multiplied: a memory of last May that shares
no word with "what did I do last May?" (fused ~0.1) is lifted over the chat's relevance threshold
(0.2), and a scale is kept: what the query matches in words still outranks a mere date."""


def times(text: str, today: date) -> tuple[Window, ...]:
    """The times `text` names (the module docstring), relative to `today`; () for none."""
    if not CLUE.search(text):
        return ()
    words = set(TOKEN.findall(text.lower()))
    found: list[Window] = []
    rest = text
    for needs, pattern, read in READERS:
        if needs.isdisjoint(words):  # most patterns cannot match: skipped unread (~5x faster)
            continue
        matches = list(pattern.finditer(rest))
        for match in matches:
            found += read(match, today)
        for match in matches:  # each part is read once
            start, end = match.span()
            rest = rest[:start] + " " * (end - start) + rest[end:]
    return tuple(sorted(set(found)))


def asked_times(query: str, today: date) -> tuple[Window, ...]:
    """The past times a question names (:func:`times`), without those that hold `today`: "what
    should I cook tonight?", "this week", "this year" ask about the present, and favouring
    everything said lately would lift unrelated memories over the relevance threshold."""
    return tuple(w for w in times(query, today) if not w.holds(today))


def in_time(when: Sequence[Window], observed_at: datetime, content: str) -> bool:
    """Whether a memory said at `observed_at` holding `content` belongs to the times `when`."""
    said = utc_day(observed_at)
    if any(w.holds(said) for w in when):
        return True
    return any(w.meets(d) for d in _named(content, said) for w in when)


@functools.lru_cache(maxsize=4096)
def _named(content: str, said: date) -> tuple[Window, ...]:
    return times(content, said)
