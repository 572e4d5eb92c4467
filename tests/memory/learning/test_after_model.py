"""The rules after the model (issue 26), on real answers of the small models: memories the 0.5B
and the 1.5B wrote on LoCoMo's first sessions (bench/manager_eval.py, two-step, json_schema),
each with what memproxy stores of it once the rules and the dates have run (None: dropped)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from app.memory.learning.after_model import after_model, tidied
from app.memory.learning.dates import absolute_dates
from app.memory.learning.decisions import Op, Operation
from app.memory.learning.grounding import Grounds
from app.memory.learning.prompt import Shown

ANSWERS = [
    ("qwen1.5b", "2023-05-08", "Plans to continue my education and check out career options, which is pretty exciting!",
     "Plans to continue their education and check out career options!"),
    ("qwen1.5b", "2023-05-08", "Keen on counseling or working in mental health, which is a great opportunity for me to support those with similar issues",
     "Keen on counseling or working in mental health"),
    ("qwen1.5b", "2023-05-08", "Participated in a LGBTQ support group yesterday and was deeply moved by the power of the experience",
     "Participated in a LGBTQ support group on 7 May 2023 and was deeply moved by the power of the experience"),
    ("qwen1.5b", "2023-05-08", "The support group has helped me feel accepted and given courage to embrace myself, which is a significant step forward",
     "The support group has helped them feel accepted and given courage to embrace themselves"),
    ("qwen1.5b", "2023-06-09", "Reflected on how far I've come since I started transitioning three years ago",
     "Reflected on how far they've come since they started transitioning around 2020"),
    ("qwen1.5b", "2023-06-09", "Here's a pic from when we met up last week!",
     "Here's a pic from when they met up in the week of 29 May 2023!"),
    ("qwen1.5b", "2023-05-25", "So I'm carving out some me-time each day - running, reading, or playing my violin - which refreshes me and helps me stay present for my fam!",
     "Is carving out some me-time each day - running, reading, or playing their violin - which refreshes them and helps them stay present for their fam!"),
    ("qwen1.5b", "2023-06-09", "I'm lucky to have my husband and kids; they keep me motivated",
     "Is lucky to have their husband and kids; they keep them motivated"),
    ("qwen1.5b", "2023-06-09", "We played games, ate good food, and just hung out together",
     "They played games, ate good food, and just hung out together"),
    ("qwen1.5b", "2023-06-06", "Had a health scare last week – a sudden heart palpitation incident that really shook me up",
     "Had a health scare in the week of 29 May 2023 – a sudden heart palpitation incident that really shook them up"),
    ("qwen1.5b", "2023-05-24", "Will catch up with you later", None),
    ("qwen1.5b", "2023-06-06", "Here for you, Sam", None),
    ("qwen1.5b", "2023-05-18", "Hiked with my dad when I was ten", "Hiked with their dad when they were ten"),
    ("qwen0.5b", "2023-05-25", "Feeling I'm truly grateful for all the support I've got from friends and mentors",
     "Feeling they're truly grateful for all the support they've got from friends and mentors"),
    ("qwen0.5b", "2023-05-25", "It'll be tough as a single parent, but I'm up for the challenge!",
     "It'll be tough as a single parent, but is up for the challenge!"),
    ("qwen0.5b", "2023-06-09", "I'm super thankful, ", "Is super thankful"),
    ("qwen0.5b", "2023-06-09", "Wow, what an amazing family pic!", None),
    ("qwen0.5b", "2023-05-08", "Is this your own painting?", None),
    ("qwen0.5b", "2023-05-25", "Hey Caroline, since we last chatted, I've had a lot of things happening to me.",
     "Since they last chatted, they've had a lot of things happening to them."),
    ("qwen0.5b", "2023-05-25", "I ran a charity race for mental health last Saturday – it was really rewarding.",
     "Ran a charity race for mental health on 20 May 2023 – it was really rewarding."),
    ("qwen0.5b", "2023-05-18", "When did you get to go there? We all hiked the trails last week - the views were amazing!",
     "They all hiked the trails in the week of 8 May 2023 - the views were amazing!"),
    ("qwen0.5b", "2023-05-18", "My friend got me into it and gave me some advice, and I was hooked right away!",
     "Their friend got them into it and gave them some advice, and was hooked right away!"),
    ("qwen0.5b", "2023-05-24", "Last weekend, I took my family on a road trip to Jasper. " * 5 + "Last weekend, I",
     "On the weekend of 20 May 2023, they took their family on a road trip to Jasper."),
    ("qwen0.5b", "2023-06-06", "I'm here for you, Sam", None),
    ("qwen0.5b", "2023-05-18", "I love hiking, but it's been ages since I've done it",
     "Loves hiking, but it's been ages since they've done it"),
    ("qwen0.5b", "2023-05-24", "I won't stress - just gonna enjoy it.", "Will not stress - just gonna enjoy it."),
    ("qwen0.5b", "2023-06-06", "By the way, I'm coming from the shop and I had a frustrating issue at the supermarket.",
     "Is coming from the shop and they had a frustrating issue at the supermarket."),
]  # fmt: skip
"""(model, the day the session was said, what the model wrote, what is stored or None)."""


@pytest.mark.parametrize(("model", "day", "written", "stored"), ANSWERS)
def test_a_small_model_s_memory_is_stored_as_a_person_would_write_it(
    model: str, day: str, written: str, stored: str | None
) -> None:
    said_on = datetime.fromisoformat(day).replace(hour=13, tzinfo=UTC)
    (text, why) = tidied(written)
    assert (why is None) == (stored is not None), (model, written, why)
    if stored is not None:
        assert absolute_dates(text, said_on) == stored  # as the applier dates it


def test_a_write_that_only_restates_a_memory_shown_is_dropped_and_deletes_pass() -> None:
    shown = [Shown(1, "Likes hiking in the Alps with their dad", "fact", datetime.now(UTC))]
    grounds = Grounds.of([], shown)
    operations = [
        Operation(op=Op.NEW, content="I like hiking in the Alps"),  # restates memory 1
        Operation(op=Op.UPDATE, id=1, content="Likes hiking"),  # shrinks it to its own words
        Operation(op=Op.NEW, content="I like hiking in the Alps in winter"),  # says more
        Operation(op=Op.DELETE, id=1),
        Operation(op=Op.NEW, content="Hey Mel!"),
    ]
    kept, dropped = after_model(operations, grounds)
    assert kept == [Operation(op=Op.NEW, content="Likes hiking in the Alps in winter"),
                    Operation(op=Op.DELETE, id=1)]  # fmt: skip
    assert [d.reason for d in dropped] == [
        "restates memory 1", "restates memory 1", "small talk (greeting)",
    ]  # fmt: skip


@pytest.mark.parametrize("written", [
    "Lives in Portland, Oregon", "Works at Acme Inc. in Berlin", "Went to St. Louis with Dr. Smith",
    "Has two kids. Their daughter Mia is 5", "Works at a startup, which is a key supplier for Airbus",
    "Lived in Paris. Later moved to Berlin.", "Is a big fan of Your Lie in April",
    "Evening runs are their favourite",
])  # fmt: skip
def test_what_says_more_than_the_chat_is_kept_whole(written: str) -> None:
    """Shapes an independent review found the rules cut (a place read as a name called out, a
    sentence split at "Inc.", a last sentence without a period, "key" read as praise)."""
    assert tidied(written) == (written, None)


def test_a_correction_to_not_is_no_restatement() -> None:
    shown = [Shown(1, "Eats meat", "fact", datetime.now(UTC)),
             Shown(2, "Lived in Paris from 2010 to 2015", "fact", datetime.now(UTC)),
             Shown(3, "Lives in Lyon", "fact", datetime.now(UTC))]  # fmt: skip
    operations = [Operation(op=Op.UPDATE, id=1, content="Does not eat meat"),
                  Operation(op=Op.UPDATE, id=3, content="Lives in Paris")]  # fmt: skip
    kept, dropped = after_model(operations, Grounds.of([], shown))
    assert kept == operations and dropped == []
