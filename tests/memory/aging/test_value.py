"""What a memory is worth keeping (app/memory/aging/value.py) and which leave over a capacity
(app/memory/aging/forgetting.py `choose`): by use, not by the age of what it says; recalls
strengthen; pinned and profile memories never leave."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.memory.aging.forgetting import Capacities, choose
from app.memory.aging.value import DISTILLED, retention, value
from app.memory.store.archive import Standing

NOW = datetime(2026, 11, 26, 12, tzinfo=UTC)


def memory(key: int, *, days: float = 0, recalls: int = 0, recalled_days: float | None = None,
           kind: str = "fact", kept: bool = False, linked: bool = False) -> Standing:  # fmt: skip
    written = NOW - timedelta(days=days)
    last = None if recalled_days is None else NOW - timedelta(days=recalled_days)
    return Standing(key, f"m{key}", kind, kept, linked, written, written, recalls, last)


def test_a_memory_just_used_is_worth_all_and_one_unused_loses_value_by_its_strength() -> None:
    assert retention(memory(1), NOW) == pytest.approx(1.0)
    month = retention(memory(1, days=30), NOW)
    assert month == pytest.approx(0.3679, abs=1e-3)  # exp(-30 / 30)
    # each recall adds strength: the same month costs a memory recalled twice far less
    assert retention(memory(1, days=30, recalls=2, recalled_days=30), NOW) == pytest.approx(
        0.7165, abs=1e-3
    )


def test_a_recall_is_a_use_and_a_write_long_ago_is_not_one() -> None:
    old_but_recalled = memory(1, days=400, recalls=1, recalled_days=1)
    old_unrecalled = memory(2, days=400)
    assert value(old_but_recalled, NOW) > 0.9 > 0.001 > value(old_unrecalled, NOW)


def test_an_episode_a_fact_was_written_from_is_worth_half() -> None:
    alone = memory(1, days=10, kind="episode")
    distilled = memory(2, days=10, kind="episode", linked=True)
    assert value(distilled, NOW) == pytest.approx(value(alone, NOW) * DISTILLED)
    fact = memory(3, days=10, linked=True)  # a fact's links do not lower it
    assert value(fact, NOW) == pytest.approx(value(alone, NOW))


def test_over_a_capacity_the_least_valuable_leave_until_it_holds() -> None:
    standing = [
        memory(1, days=200), memory(2, days=1), memory(3, days=90, recalls=5, recalled_days=20),
        memory(4, days=60), memory(5, days=5),
    ]  # fmt: skip
    leaving = choose(standing, Capacities(facts=3), NOW)
    assert [m.key for m in leaving] == [1, 4]
    assert "over the capacity of 3 facts (5 held)" in leaving[0].reason
    assert "never recalled, last used 2026-05-10 (200 days before)" in leaving[0].reason
    assert leaving[0].value < leaving[1].value


def test_pinned_and_profile_memories_count_but_never_leave() -> None:
    standing = [memory(1, days=999, kept=True), memory(2, days=998, kept=True), memory(3, days=1),
                memory(4, days=2)]  # fmt: skip
    assert [m.key for m in choose(standing, Capacities(facts=2), NOW)] == [4, 3]
    only_kept = [memory(1, days=999, kept=True), memory(2, days=999, kept=True)]
    assert choose(only_kept, Capacities(facts=1), NOW) == []


def test_facts_and_episodes_have_their_own_capacities_and_zero_is_none() -> None:
    standing = [memory(1, days=50), memory(2, days=40), memory(3, days=30, kind="episode"),
                memory(4, days=20, kind="episode", linked=True),
                memory(5, days=10, kind="episode")]  # fmt: skip
    assert choose(standing, Capacities(), NOW) == []
    # the linked one (20 days, worth half: .257) before the older one alone (30 days: .368)
    assert [m.key for m in choose(standing, Capacities(facts=0, episodes=1), NOW)] == [4, 3]
    # the linked episode is worth half: at equal use it leaves before the other
    equal = [memory(1, days=10, kind="episode"), memory(2, days=10, kind="episode", linked=True)]
    (gone,) = choose(equal, Capacities(episodes=1), NOW)
    assert gone.key == 2 and "a fact holds what it said" in gone.reason
    assert [m.key for m in choose(standing, Capacities(facts=1), NOW)] == [1]
