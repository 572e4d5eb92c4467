"""First person to third person by rule (issue 26): the shapes small models write."""

from __future__ import annotations

import pytest

from app.memory.learning.third_person import third_person


@pytest.mark.parametrize(("written", "stored"), [
    ("I'm going to continue my edu and check out career options",
     "Is going to continue their edu and check out career options"),  # the 1.5B, one call
    ("I love my new running shoes", "Loves their new running shoes"),
    ("I am a nurse", "Is a nurse"), ("I'm not a fan of horror", "Is not a fan of horror"),
    ("I was born in 1990", "Was born in 1990"), ("I have two kids, and I'm married",
                                                  "Has two kids, and is married"),
    ("I've been painting for seven years", "Has been painting for seven years"),
    ("I'd love to visit Paris", "Would love to visit Paris"), ("I'd been there before",
                                                                "Had been there before"),
    ("I don't eat meat", "Does not eat meat"), ("I do yoga", "Does yoga"),
    ("I study art", "Studies art"), ("I can swim", "Can swim"), ("I went to Oslo", "Went to Oslo"),
    ("I really love hiking. I go every week.", "Really loves hiking. Goes every week."),
    ("Loves hiking, and I go every week", "Loves hiking, and goes every week"),
    ("My mom and I went to Rome", "Their mom and they went to Rome"),
    ("Thinks I should go", "Thinks they should go"),
    ("Is excited because I got the job", "Is excited because they got the job"),
    ("We went camping with our kids", "They went camping with their kids"),
    ("My sister has two cats", "Their sister has two cats"),
    ("Caroline told me about it", "Caroline told them about it"),
    ("Taking care of ourselves matters", "Taking care of themselves matters"),
    ('Watched "I Love Lucy" with my mom', 'Watched "I Love Lucy" with their mom'),  # a title
    ("Carves out some me-time", "Carves out some me-time"),
    ("Moved to the US in 2019", "Moved to the US in 2019"), ("Lives in Lyon", "Lives in Lyon"),
])  # fmt: skip
def test_first_person_is_written_in_the_third(written: str, stored: str) -> None:
    assert third_person(written) == stored


@pytest.mark.parametrize(("written", "stored"), [
    ("Has Type I diabetes", "Has Type I diabetes"), ("I couldn't find a job", "Could not find a job"),
    ("I hadn't seen her", "Had not seen her"), ("I slept badly", "Slept badly"),
    ("I probably will move", "Probably will move"), ("I once lived in Rome", "Once lived in Rome"),
    ("Collects My Little Pony toys", "Collects My Little Pony toys"),
    ("I reply within a day", "Replies within a day"),
    ("Told Ana I was moving", "Told Ana they were moving"),
])  # fmt: skip
def test_shapes_a_review_found_are_written_right(written: str, stored: str) -> None:
    assert third_person(written) == stored
