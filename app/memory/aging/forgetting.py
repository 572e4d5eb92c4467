"""Forgetting over a capacity: when a user holds more facts than ``MEMPROXY_MAX_FACTS`` (or more
episodes than ``MEMPROXY_MAX_EPISODES``), the least valuable (:mod:`.value`) leave until the
count is back at the capacity, each into the archive with its reason
(:mod:`app.memory.store.archive`), from where it can be put back with the same id until
``MEMPROXY_FORGOTTEN_KEEP_DAYS`` have passed.

Promises: pinned memories and profile memories never leave (they count towards the capacity,
so a store of nothing else stays over it); what leaves is exactly what :meth:`Forgetting.plan`
shows for the same memories (the dry run); every removal is a ``forgotten`` event naming its
reason; one unit of work per run (with the idle job it consumes, when one runs it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from app.config import Settings
from app.memory.aging.value import last_use, value
from app.memory.search.parts import embed_for_store
from app.memory.service import MemoryService
from app.memory.store.archive import (
    Execute,
    Forgotten,
    Standing,
    as_forgotten,
    forget,
    held,
    relink,
    standing,
    take_back,
)
from app.memory.store.claims import IdTaken, found
from app.memory.store.memories import MemoryStore
from app.memory.store.records import (
    MemoryRecord,
    NewMemory,
    Removed,
    Written,
    new_row,
    now,
    record_of,
)
from app.memory.store.tables import MemorySource, MemoryType
from app.memory.store.unit import Writer


@dataclass(frozen=True, slots=True)
class Capacities:
    """Per user; 0: no capacity."""

    facts: int = 0
    episodes: int = 0


@dataclass(frozen=True, slots=True)
class Forgot:
    """What a run took out, and the user's version it committed."""

    leaving: list[Leaving]
    version: int


@dataclass(frozen=True, slots=True)
class Leaving:
    """A memory forgetting takes out, and why."""

    key: int
    id: str
    type: str
    value: float
    reason: str
    content: str = ""


def choose(standing: list[Standing], capacities: Capacities, at: datetime) -> list[Leaving]:
    """Which memories leave for the user to be back within `capacities` (least valuable first,
    the oldest use first among equals), each with its reason; never a pinned or profile one."""
    leaving: list[Leaving] = []
    episodes = [m for m in standing if m.type == MemoryType.EPISODE.value]
    facts = [m for m in standing if m.type != MemoryType.EPISODE.value]
    for group, capacity, kind in ((facts, capacities.facts, "facts"),
                                  (episodes, capacities.episodes, "episodes")):  # fmt: skip
        excess = len(group) - capacity
        if capacity <= 0 or excess <= 0:
            continue
        weighed = sorted(
            ((value(m, at), m) for m in group if not m.kept),
            key=lambda vm: (vm[0], last_use(vm[1]), vm[1].key),
        )
        for worth, memory in weighed[:excess]:
            why = _reason(memory, worth, capacity, len(group), kind, at)
            leaving.append(Leaving(memory.key, memory.id, memory.type, worth, why))
    return leaving


def _reason(memory: Standing, worth: float, capacity: int, held: int, kind: str,
            at: datetime) -> str:  # fmt: skip
    used = last_use(memory)
    days = max(0, (at - used).days)
    count = memory.recall_count
    recalled = f"recalled {count} time{'s' * (count != 1)}" if count > 0 else "never recalled"
    distilled = " (a fact holds what it said)" if memory.type == "episode" and memory.linked else ""
    return (
        f"over the capacity of {capacity:,} {kind} ({held:,} held): among the least used, worth "
        f"{worth:.3f}; {recalled}, last used {used.date().isoformat()} ({days} days before)"
        f"{distilled}"
    )


Within = Callable[[Writer], Awaitable[None]]
"""Run inside the forgetting's unit of work: before it (the idle job consumed: exactly once),
or after it (the idle work's version recorded, as the unit commits it)."""


class Forgetting:
    def __init__(
        self, service: MemoryService, capacities: Capacities, *, keep_days: float = 90.0
    ) -> None:
        self._service = service
        self.capacities = capacities
        self.keep = timedelta(days=keep_days)

    @classmethod
    def configured(cls, service: MemoryService, settings: Settings) -> Forgetting:
        """As the settings say: ``MEMPROXY_MAX_FACTS``, ``MEMPROXY_MAX_EPISODES``,
        ``MEMPROXY_FORGOTTEN_KEEP_DAYS``."""
        capacities = Capacities(settings.max_facts, settings.max_episodes)
        return cls(service, capacities, keep_days=settings.forgotten_keep_days)

    @property
    def store(self) -> MemoryStore:
        return self._service.store

    def over(self, facts: int, episodes: int, *, by: float = 0.0) -> bool:
        """Whether a user holding these is past a capacity (by more than the share `by` of it,
        at least one memory, when `by` is given)."""
        caps = self.capacities
        return any(
            cap > 0 and held > cap + (max(1, int(cap * by)) if by else 0)
            for held, cap in ((facts, caps.facts), (episodes, caps.episodes))
        )

    async def _weigh(self, execute: Execute, user_id: str) -> list[Leaving]:
        """What leaves now, read with `execute` (a session's, or a unit's under its lock)."""
        if not self.over(*await held(execute, user_id)):
            return []  # within both: no need to weigh every memory
        return choose(await standing(execute, user_id), self.capacities, now())

    async def plan(self, user_id: str) -> list[Leaving]:
        """What would leave now (the dry run), with the words of each."""
        async with self.store.sessions() as session:
            leaving = await self._weigh(session.execute, user_id)
        if not leaving:
            return []
        words = await self.store.contents(user_id, [m.key for m in leaving])
        return [replace(m, content=words.get(m.key, "")) for m in leaving]

    async def forget(
        self,
        user_id: str,
        *,
        actor: MemorySource = MemorySource.UPKEEP,
        job_id: str | None = None,
        within: Within | None = None,
        after: Within | None = None,
    ) -> Forgot:
        """Take out what is over the capacities, into the archive, in one unit of work: `within`
        first, then the user's write lock, then the weighing (so that a memory pinned, changed
        or forgotten meanwhile is seen as it is), the moves, and `after`. What left, as
        :meth:`plan` would have shown it at that moment."""
        async with self.store.writing(user_id, actor, job_id=job_id) as w:
            if within is not None:
                await within(w)
            await w.lock()
            leaving = await self._weigh(w.execute, user_id)
            words = await forget(w, {m.key: m.reason for m in leaving}) if leaving else {}
            if after is not None:
                await after(w)
        assert w.version is not None
        if words:
            self._service.cache.deleted(user_id, Removed(sorted(words), w.version))
        gone = [replace(m, content=words[m.key]) for m in leaving if m.key in words]
        return Forgot(gone, w.version)

    async def purge(self) -> int:
        """Erase, for every user, a batch of what was forgotten longer ago than the keep time:
        how many (the rest at the next call)."""
        return await self.store.purge_forgotten(now() - self.keep)

    async def forgotten(
        self, user_id: str, *, limit: int, offset: int = 0
    ) -> tuple[list[Forgotten], int]:
        return await self.store.forgotten(user_id, limit=limit, offset=offset)

    async def restore(
        self, user_id: str, memory_id: str, *, actor: MemorySource = MemorySource.API
    ) -> MemoryRecord | None:
        """Put a forgotten memory back, same id, linked again to what still exists, written now
        (its last use: the next run does not take it again at once), in one unit of work that
        also takes it out of the archive; None when the archive has no such memory of the
        user. :class:`IdTaken` when a memory has its id by now (an import put it back)."""
        service = self._service
        kept = await service.store.forgotten_one(user_id, memory_id)
        if kept is None:
            return None
        (embedded,) = await embed_for_store(service.embedder, [kept.index_text or kept.content])
        async with service.store.writing(user_id, actor) as w:
            await w.lock()
            if await found(w, [memory_id]):  # another user's raises IdTaken here
                raise IdTaken(memory_id)
            row = await take_back(w, memory_id)
            if row is None:
                return None  # put back meanwhile
            memory = new_row(user_id, _back(as_forgotten(row), actor), now())
            memory.embedding, memory.embedding_model = embedded.embedding, embedded.model
            await w.insert_new([memory], {memory.id: _detail(as_forgotten(row))})
            links = await relink(w, memory, row.links)
        assert w.version is not None
        record = record_of(memory)
        service.cache.written(
            user_id, Written([record], w.version, [True], links), [embedded.vectors]
        )
        return record


def _back(kept: Forgotten, actor: MemorySource) -> NewMemory:
    return NewMemory(
        content=kept.content, type=MemoryType(kept.type), metadata=kept.metadata,
        source=actor, kept_source=MemorySource(kept.source), id=kept.id,
        created_at=kept.created_at, observed_at=kept.observed_at,
        recall_count=kept.recall_count, last_recalled_at=kept.last_recalled_at,
        index_text=kept.index_text,
    )  # fmt: skip


def _detail(kept: Forgotten) -> str:
    when = kept.forgotten_at.date().isoformat()
    return f"put back from the forgotten memories (forgotten {when}: {kept.reason})"
