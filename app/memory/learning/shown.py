"""The memories one job shows the Manager, numbered: what the worker and the benches search.

The Manager names memories by the small numbers it was shown them with (models invent UUIDs):
:class:`ShownMemories` gives each memory found for a job its number, the first time it is shown,
and keeps the map back to the memory's id for the applier. The one-call Manager is shown the
user's facts most related to the job's new user turns (:meth:`ShownMemories.related`); the
two-step one, for each sentence it chose, the few most like that sentence
(:meth:`ShownMemories.like`, a :class:`~app.memory.learning.staged.Lookup`). Only facts are
shown: episodes are the user's words, not the Manager's to change.
"""

from __future__ import annotations

from datetime import datetime

from app.memory.learning.prompt import Shown
from app.memory.service import MemoryService
from app.memory.store.tables import FactType

RELATED_MEMORIES = 20
"""Memories shown to the one-call Manager."""
QUERY_CHARS = 2000
"""The end of the job's user turns that finds them."""


class ShownMemories:
    """A job's shown memories (:attr:`shown`, in order) and their ids by number
    (:attr:`aliases`)."""

    def __init__(self, service: MemoryService, user_id: str, now: datetime | None) -> None:
        self._service = service
        self._user_id = user_id
        self._now = now
        self.shown: list[Shown] = []
        self.aliases: dict[int, str] = {}
        self._numbers: dict[str, int] = {}

    async def related(self, user_turns: list[str]) -> list[Shown]:
        """The user's facts most related to the job's user turns (the end of them joined)."""
        query = " ".join(user_turns)[-QUERY_CHARS:]
        return await self._find(query or "-", RELATED_MEMORIES)

    async def like(self, text: str, limit: int) -> list[Shown]:
        """The user's `limit` facts most like `text`."""
        return await self._find(text, limit)

    async def _find(self, query: str, limit: int) -> list[Shown]:
        found = await self._service.search(
            self._user_id, query, limit=limit, min_score=0.0,
            types=[t.value for t in FactType], background=True, now=self._now,
        )  # fmt: skip
        out = []
        for item in found:
            memory = item.memory
            number = self._numbers.get(memory.id)
            if number is None:
                number = self._numbers[memory.id] = len(self.shown) + 1
                self.shown.append(Shown(number, memory.content, memory.type, memory.observed_at))
                self.aliases[number] = memory.id
            out.append(self.shown[number - 1])
        return out
