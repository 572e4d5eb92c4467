"""What a chat is shown of the hits: facts and episodes within their shares, never a fact beside
the episode it came from (app.memory.search.selection)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from app.memory.block import estimate_tokens, memory_line
from app.memory.search.selection import choose

SAID = datetime(2026, 11, 20, tzinfo=UTC)


@dataclass(frozen=True)
class H:
    key: int
    type: str
    content: str
    observed_at: datetime = SAID
    score: float = 0.5


def fact(key: int, words: int = 3) -> H:
    return H(key, "fact", " ".join(f"fact{key}" for _ in range(words)))


def episode(key: int, words: int = 3) -> H:
    return H(key, "episode", " ".join(f"said{key}" for _ in range(words)))


def cost(hit: H) -> int:
    return estimate_tokens(memory_line(hit))


def keys(hits: list[H]) -> list[int]:
    return [h.key for h in hits]


def test_facts_first_then_episodes_each_best_first() -> None:
    hits = [episode(1), fact(2), episode(3), fact(4)]  # best first
    shown = choose(hits, {}, limit=10, budget_tokens=1000, episode_share=0.5)
    assert keys(shown) == [2, 4, 1, 3]


def test_a_fact_and_the_episode_it_came_from_are_not_both_shown() -> None:
    hits = [fact(1), episode(2), episode(3)]
    links = {1: {2}, 2: {1}}
    assert keys(choose(hits, links, limit=10, budget_tokens=1000, episode_share=0.5)) == [1, 3]
    # the fact says it for both, unless its episode answers much better
    close = [H(2, "episode", "said2 said2", score=0.55), H(1, "fact", "fact1", score=0.5)]
    assert keys(choose(close, links, limit=10, budget_tokens=1000, episode_share=0.5)) == [1]
    far = [H(2, "episode", "said2 said2", score=0.65), H(1, "fact", "fact1", score=0.5)]
    assert keys(choose(far, links, limit=10, budget_tokens=1000, episode_share=0.5)) == [2]
    # a fact that was not found relevant gives way to nothing
    assert keys(choose(far[:1], links, limit=10, budget_tokens=1000, episode_share=0.5)) == [2]


def test_what_the_profile_shows_blocks_its_episodes() -> None:
    hits = [episode(2), episode(3)]
    shown = choose(hits, {1: {2}, 2: {1}}, limit=10, budget_tokens=1000, episode_share=0.5,
                   shown={1})  # fmt: skip
    assert keys(shown) == [3]


def test_each_kind_keeps_its_share_against_better_scores_of_the_other() -> None:
    """Episodes scoring above every fact cannot crowd the facts out, nor the reverse."""
    long_episodes = [episode(k, words=20) for k in range(1, 6)]
    facts = [fact(k) for k in range(10, 13)]
    per_episode, per_fact = cost(long_episodes[0]), cost(facts[0])
    budget = 2 * per_episode + 3 * per_fact
    share = 2 * per_episode / budget
    shown = choose([*long_episodes, *facts], {}, limit=10, budget_tokens=budget,
                   episode_share=share)  # fmt: skip
    assert keys(shown) == [10, 11, 12, 1, 2]  # without shares: 1, 2, 3, 4, 5 only
    shown = choose([*facts, *long_episodes], {}, limit=10, budget_tokens=budget,
                   episode_share=share)  # fmt: skip
    assert keys(shown) == [10, 11, 12, 1, 2]


def test_what_one_kind_leaves_unused_goes_to_the_other() -> None:
    facts = [fact(k) for k in range(1, 7)]
    budget = 6 * cost(facts[0])
    shown = choose(facts, {}, limit=10, budget_tokens=budget, episode_share=0.5)
    assert keys(shown) == [1, 2, 3, 4, 5, 6]  # no episode found: facts take the whole budget
    episodes = [episode(k) for k in range(1, 7)]
    budget = 6 * cost(episodes[0])
    shown = choose(episodes, {}, limit=10, budget_tokens=budget, episode_share=0.2)
    assert keys(shown) == [1, 2, 3, 4, 5, 6]


def test_a_hit_too_long_is_passed_over_and_shorter_ones_still_go_in() -> None:
    long = fact(1, words=200)
    short = [fact(2), fact(3)]
    budget = cost(short[0]) * 2
    assert keys(choose([long, *short], {}, limit=10, budget_tokens=budget, episode_share=0)) == [
        2,
        3,
    ]


def test_the_limit_counts_both_kinds() -> None:
    hits = [fact(1), episode(2), fact(3), episode(4)]
    assert keys(choose(hits, {}, limit=3, budget_tokens=1000, episode_share=0.5)) == [1, 3, 2]


def test_nothing_fits_a_budget_of_zero() -> None:
    assert choose([fact(1), episode(2)], {}, limit=10, budget_tokens=0, episode_share=0.5) == []


def test_an_episode_line_says_who_said_it_and_when() -> None:
    line = memory_line(H(1, "episode", 'No. (answering "Do you eat honey?")'))
    assert line == '- [2026-11-20] the user said: No. (answering "Do you eat honey?")'
    assert memory_line(H(2, "fact", "Is vegan")) == "- [2026-11-20] Is vegan"


def test_an_episode_waiting_on_its_fact_is_shown_when_the_fact_does_not_fit() -> None:
    long_fact = H(1, "fact", " ".join(["fact1"] * 200), score=0.5)
    said = H(2, "episode", "said2 said2", score=0.55)
    shown = choose([said, long_fact], {1: {2}, 2: {1}}, limit=10, budget_tokens=60,
                   episode_share=0.5)  # fmt: skip
    assert keys(shown) == [2]
    assert keys(choose([said, long_fact], {1: {2}, 2: {1}}, limit=10, budget_tokens=2000,
                       episode_share=0.5)) == [1]  # fmt: skip
