"""The profile: the user's pinned memories and standing facts about them (``profile``), shown in
every chat whatever the question, within a token budget of their own.

Promises:

- taken from the user's index (:class:`~app.memory.search.cache.UserIndex`), never from the
  database: it rides on the search's own check that the index is current;
- past the budget, the most recalled go first, then the newest (``observed_at``), then the
  latest written; that order is also the order shown. Only searched hits count as recalls (the
  chat glue marks nothing else), so showing a memory here does not keep it here;
- the searched memories shown beside it are never one of these (:mod:`app.memory.search.ranking`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from app.memory.block import fit_budget
from app.memory.search.user_index import UserIndex


@dataclass(frozen=True, slots=True)
class Standing:
    """A profile memory as the block shows it."""

    key: int
    content: str
    observed_at: datetime
    type: str


def standing(entry: UserIndex, budget_tokens: int) -> list[Standing]:
    """The pinned and profile memories of `entry` that fit `budget_tokens`, in the module
    docstring's order (none when the budget is 0). Call with `entry`'s lock held."""
    if budget_tokens <= 0 or not entry.standing:
        return []
    briefs = entry.briefs
    order = sorted(
        entry.standing,
        key=lambda k: (-briefs[k].recall_count, -briefs[k].observed_at.timestamp(), -k),
    )
    return fit_budget(
        [Standing(k, briefs[k].content, briefs[k].observed_at, briefs[k].type) for k in order],
        budget_tokens,
    )
