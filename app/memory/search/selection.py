"""Which of the memories a search found a chat is shown: facts and episodes, each within its own
share of the token budget, and never a fact beside the episode it came from.

Promises (:func:`choose`):

- hits are taken best score first, and a hit linked to one already taken (or to a profile
  memory shown above them) is passed over: a fact and the episode it was written from say the
  same thing, and one of them says it for both. The fact, unless the episode scores more than
  :data:`FACT_PREFERENCE` above it: the fact says it in fewer words ("Plays chess" rather than
  "Remember that I play chess"), while an episode that answers much better holds what the fact
  left out ("... after my shift at the hospital");
- episodes (the user's words) may take ``episode_share`` of ``budget_tokens``, facts the rest;
  what one kind leaves unused goes, in a second pass, to the best hits not yet taken of either
  kind, so the budget is not wasted on a chat that found only one kind;
- at most ``limit`` hits in all; none that would not fit (a long one is passed over and shorter
  ones after it may still go in, as :func:`app.memory.block.fit_budget` does);
- the order shown is facts first, then episodes, each best first.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Protocol, TypeVar

from app.memory.block import Dated, estimate_tokens, memory_line
from app.memory.store.tables import MemoryType

_EPISODE = MemoryType.EPISODE.value
FACT_PREFERENCE = 0.1
"""How much higher than a linked fact an episode must score to be shown instead of it (on the
fused score's 0-1 scale: :mod:`app.memory.search.ranking`)."""


class Shown(Dated, Protocol):
    """A search hit as the selection reads it."""

    @property
    def key(self) -> int: ...

    @property
    def score(self) -> float: ...


H = TypeVar("H", bound=Shown)


def choose(
    hits: Sequence[H],
    links: Mapping[int, Collection[int]],
    *,
    limit: int,
    budget_tokens: int,
    episode_share: float,
    shown: Collection[int] = (),
) -> list[H]:
    """The hits to show, in the order shown (module docstring). `hits` best first; `links`:
    memory key -> keys of the memories linked to it; `shown`: keys already in the block (the
    profile)."""
    episode_budget = int(budget_tokens * episode_share)
    budgets = {True: episode_budget, False: budget_tokens - episode_budget}
    used = {True: 0, False: 0}
    taken: list[tuple[int, H]] = []  # (position in hits, hit)
    blocked: set[int] = set()
    for key in shown:
        blocked.update(links.get(key, ()))
    costs: dict[int, int] = {}  # position -> tokens, worked out for the hits looked at only

    def cost(at: int) -> int:
        if at not in costs:
            costs[at] = estimate_tokens(memory_line(hits[at]))
        return costs[at]

    best = {h.key: h.score for h in hits}
    deferred = {  # an episode a linked fact says well enough waits: taken, the fact blocks it
        hit.key
        for hit in hits
        if hit.type == _EPISODE
        and any(best.get(f, -1.0) >= hit.score - FACT_PREFERENCE for f in links.get(hit.key, ()))
    }

    def take(at: int, hit: H, kind: bool, cost: int) -> None:
        taken.append((at, hit))
        used[kind] += cost
        blocked.add(hit.key)
        blocked.update(links.get(hit.key, ()))

    for at, hit in enumerate(hits):  # each kind within its own share
        if len(taken) >= limit:
            break
        kind = hit.type == _EPISODE
        if hit.key in deferred:
            continue
        if hit.key not in blocked and used[kind] + cost(at) <= budgets[kind]:
            take(at, hit, kind, cost(at))
    spare = budget_tokens - used[True] - used[False]
    chosen = {at for at, _ in taken}
    # then what either kind left unused, best first (an episode whose fact did not fit too)
    for at, hit in enumerate(hits):
        if len(taken) >= limit or spare <= 0:
            break
        if at in chosen or hit.key in blocked or cost(at) > spare:
            continue
        take(at, hit, hit.type == _EPISODE, cost(at))
        spare -= cost(at)
    taken.sort(key=lambda pair: (pair[1].type == _EPISODE, pair[0]))
    return [hit for _, hit in taken]
