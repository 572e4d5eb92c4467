"""What a memory is worth keeping, by its use (MemoryBank's retention, arXiv 2305.10250):
``R = exp(-t / S)``, `t` the days since the memory was last used (written, changed, recalled
into a chat, or put back), `S` its strength, which grows with every recall.

Use, not age: what was said long ago is not worth less for it (a history learned today is as
fresh as a chat), and a decay on the age of events destroyed recall on a long corpus elsewhere.
An episode a fact was written from is worth half: its content lives on in the fact.
"""

from __future__ import annotations

import math
from datetime import datetime

from app.memory.store.archive import Standing
from app.memory.store.tables import MemoryType

STRENGTH_DAYS = 30.0
"""A memory never recalled keeps half its value for ~21 days; each recall adds 30 days of
strength (recalled 11 times: half its value after ~8 months without use)."""
DISTILLED = 0.5
"""The share of its value an episode keeps once a fact was written from it."""


def last_use(memory: Standing) -> datetime:
    """When the memory was last written, changed, recalled or put back."""
    used = max(memory.created_at, memory.updated_at)
    recalled = memory.last_recalled_at
    return used if recalled is None else max(used, recalled)


def retention(memory: Standing, at: datetime) -> float:
    """``exp(-t / S)``, between 0 and 1: 1 when just used."""
    days = max(0.0, (at - last_use(memory)).total_seconds() / 86400)
    strength = STRENGTH_DAYS * (1 + max(0, memory.recall_count))
    return math.exp(-days / strength)


def value(memory: Standing, at: datetime) -> float:
    """:func:`retention`, halved for an episode a fact was written from (:data:`DISTILLED`)."""
    kept = retention(memory, at)
    if memory.type == MemoryType.EPISODE.value and memory.linked:
        kept *= DISTILLED
    return kept
