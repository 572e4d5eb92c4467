"""What says the same as a fact being forgotten (app/memory/search/restating.py): the words'
check, case by case, and the whole rule with the real bundled embedder through the service (its
threshold is that model's: the figures are in the module's docstring)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.memory.search.lexical import Analyzer
from app.memory.search.restating import SAME_AT, says
from app.memory.service import MemoryService
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory
from app.memory.store.tables import MemoryType

SAYS = [
    ("Is vegetarian", "I am vegetarian."),
    ("Is vegetarian", "Has been vegetarian since 2015"),
    ("Is vegetarian", "Since I'm vegetarian, what should I order at a steakhouse?"),
    ("Is vegetarian", "I became vegetarian two years ago and I feel great."),
    ("Allergic to peanuts", "Has a peanut allergy"),  # a stem meets its longer form
    ("Allergic to peanuts", "I have a severe peanut allergy, so please no satay."),
    ("Lives in Lyon", "Lyon is where I live"),
    ("Does not eat meat", "I don't eat meat."),  # negated on both sides
    ("Moved to Lyon in 2020", "I moved to Lyon in 2020."),  # in the past on both sides
]
DOES_NOT_SAY = [
    ("Is vegetarian", "Is vegan"),  # a word of the fact missing
    ("Is vegetarian", "I'm not vegetarian."),  # negated
    ("Is vegetarian", "I am no longer vegetarian"),
    ("Allergic to peanuts", "I have no peanut allergy"),
    ("Is vegetarian", "I used to be vegetarian."),  # in the past
    ("Lives in Lyon", "I lived in Lyon as a student."),
    ("Lives in Lyon", "I'd like to live in Lyon one day."),  # a wish
    ("Works as a nurse", "I want to work as a nurse."),
    ("Is vegetarian", "My sister is vegetarian."),  # someone else
    ("Allergic to peanuts", "Son is allergic to peanuts"),
    ("Allergic to peanuts", "Are peanuts a common allergy?"),  # asked
    ("Is vegetarian", "Likes vegetarian restaurants in Lyon"),  # qualifies another word
    ("Loves hiking", "Loves hiking books"),
    ("Works as a nurse", "The nurse works weekends."),  # another subject
]


@pytest.mark.parametrize(("fact", "sentence"), SAYS)
def test_the_words_say_it(fact: str, sentence: str) -> None:
    assert says(fact, sentence, Analyzer())


@pytest.mark.parametrize(("fact", "sentence"), DOES_NOT_SAY)
def test_the_words_do_not_say_it(fact: str, sentence: str) -> None:
    assert not says(fact, sentence, Analyzer())


CASES: list[tuple[str, list[str], list[str]]] = [
    (
        "Is vegetarian",
        [
            "Vegetarian", "Is vegetarian since 2015", "User is vegetarian",
            "episode:I am vegetarian.", "episode:I'm vegetarian, so please no meat in the recipes.",
            "episode:Hi! I'm Ana. I am vegetarian. I live in Lyon with my husband.",
        ],
        [
            "Is vegan", "episode:I am vegan.", "episode:I'm not vegetarian.",
            "episode:My sister is vegetarian.", "Likes vegetarian restaurants in Lyon",
            "Used to be vegetarian", "Eats a lot of vegetables", "Loves steak",
        ],
    ),
    (
        "Lives in Lyon",
        ["episode:I live in Lyon, near the Part-Dieu station.", "Lives in Lyon, France"],
        ["Loves Lyon", "Works in Lyon", "Lives in Paris", "Parents live in Lyon",
         "episode:I lived in Lyon as a student."],
    ),
    (
        "Allergic to peanuts",
        ["episode:Careful, I'm allergic to peanuts!", "Peanut allergy"],
        ["Allergic to cats", "episode:I'm allergic to cats.", "Loves peanut butter",
         "Is not allergic to peanuts"],
    ),
]  # fmt: skip


@pytest.mark.parametrize(("fact", "gone", "kept"), CASES, ids=[c[0] for c in CASES])
async def test_with_the_real_embedder_the_same_goes_and_the_rest_stays(
    engine: AsyncEngine, bundled_embedder: Any, fact: str, gone: list[str], kept: list[str]
) -> None:
    service = MemoryService(MemoryStore(engine), bundled_embedder)
    items = [
        NewMemory(text.removeprefix("episode:"), MemoryType.EPISODE)
        if text.startswith("episode:")
        else NewMemory(text)
        for text in [fact, *gone, *kept]
    ]
    (forgotten, *_) = (await service.add("ann", items)).records
    removed = await service.delete("ann", [forgotten.id])
    said = sorted(r.content for r in removed.also)
    assert said == sorted(t.removeprefix("episode:") for t in gone)
    listed, _ = await service.page("ann", limit=100)
    assert sorted(m.content for m in listed) == sorted(t.removeprefix("episode:") for t in kept)
    assert 0.4 < SAME_AT < 0.6
