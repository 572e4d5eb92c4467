"""The archive of forgotten memories (:class:`~app.memory.store.tables.ForgottenMemory`): what
forgetting over a capacity takes out of a user's memories, kept whole so that it can be put back
with the same id.

- :func:`forget` moves memories into the archive inside a unit of work (with the unit's other
  writes, e.g. the idle job it consumes), the user's write lock taken first: each gets a
  ``forgotten`` event with its reason, its provenance links are remembered by id and removed,
  pinned and profile memories are never taken (also when pinned a moment before);
- :func:`take_back` puts one back in a unit of work: the archive row goes in the transaction
  that inserts the memory, same id, linked again to what still exists;
- :class:`~app.memory.store.archive_book.Archive` (a part of the memory store) reads the
  archive and erases rows past the keep time; erasing a user erases their archive, moving a
  user moves it (:mod:`.whole`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Result, delete, func, insert, or_, select

from app.memory.store.records import aware, now
from app.memory.store.tables import (
    EventAction,
    ForgottenMemory,
    Memory,
    MemoryLink,
    MemoryType,
    ProcessedTurn,
)
from app.memory.store.unit import Writer

FORGET_CHUNK = 500
"""Memories per statement (a bound parameter list stays small)."""
DISTIL = "distil-"
"""How the mark of an episode given to the Manager once more begins (in the turns taken,
:class:`~app.memory.store.tables.ProcessedTurn`), and the id of the job that does it, after
``learn-`` (:mod:`app.memory.learning.distilling`)."""


def distil_marks(episode_ids: Sequence[str]) -> list[str]:
    return [f"{DISTIL}{i}" for i in episode_ids]


@dataclass(frozen=True, slots=True)
class Forgotten:
    """One archived memory, as the page and the API show it."""

    id: str
    content: str
    type: str
    metadata: dict[str, Any]
    source: str
    created_at: datetime
    observed_at: datetime
    recall_count: int
    last_recalled_at: datetime | None
    index_text: str | None
    links: list[str]
    reason: str
    forgotten_at: datetime
    cause: str = "forgotten"
    """``forgotten`` (over a capacity), ``merged`` or ``superseded`` (consolidation)."""
    ended_at: datetime | None = None
    """For a superseded fact: when it stopped being true."""


@dataclass(frozen=True, slots=True)
class Standing:
    """What forgetting weighs of one of a user's memories (no text, no vector)."""

    key: int
    id: str
    type: str
    kept: bool
    """Pinned or in the profile: never forgotten."""
    linked: bool
    """A fact was written from it (an episode), or it was written from an episode (a fact)."""
    created_at: datetime
    updated_at: datetime
    recall_count: int
    last_recalled_at: datetime | None


def _forgotten(row: ForgottenMemory) -> Forgotten:
    return Forgotten(
        row.id, row.content, row.type, dict(row.meta or {}), row.source, aware(row.created_at),
        aware(row.observed_at), row.recall_count,
        aware(row.last_recalled_at) if row.last_recalled_at else None, row.index_text,
        list(row.links or []), row.reason, aware(row.forgotten_at), row.cause or "forgotten",
        aware(row.ended_at) if row.ended_at else None,
    )  # fmt: skip


Execute = Callable[[Any], Awaitable[Result[Any]]]
"""A session's or a unit's ``execute``: the reads below run in either."""


async def held(execute: Execute, user_id: str) -> tuple[int, int]:
    """How many facts and episodes the user holds (one count query)."""
    episode = Memory.type == MemoryType.EPISODE.value
    found = await execute(
        select(func.count(), func.count().filter(episode)).where(Memory.user_id == user_id)
    )
    total, episodes = cast("tuple[int, int]", tuple(found.one()))
    return int(total) - int(episodes), int(episodes)


async def standing(execute: Execute, user_id: str) -> list[Standing]:
    """Every memory of the user, as forgetting weighs it (one read: ~100 bytes a memory)."""
    links = await execute(
        select(MemoryLink.fact_id, MemoryLink.episode_id).where(MemoryLink.user_id == user_id)
    )
    linked = {i for pair in cast("list[tuple[str, str]]", links.all()) for i in pair}
    found = await execute(
        select(Memory.key, Memory.id, Memory.type, Memory.pinned, Memory.profile,
               Memory.created_at, Memory.updated_at, Memory.recall_count,
               Memory.last_recalled_at)
        .where(Memory.user_id == user_id)
    )  # fmt: skip
    rows = cast("list[tuple[int, str, str, bool, bool, datetime, datetime, int, Any]]",
                found.all())  # fmt: skip
    return [
        Standing(key, memory_id, kind, bool(pinned or profile), memory_id in linked,
                 aware(created), aware(updated), int(count or 0), aware(last) if last else None)
        for key, memory_id, kind, pinned, profile, created, updated, count, last in rows
    ]  # fmt: skip


CAUSES = {"forgotten": EventAction.FORGOTTEN, "merged": EventAction.MERGED,
          "superseded": EventAction.SUPERSEDED}  # fmt: skip
"""Why a memory leaves for the archive, and the event that says so."""


async def forget(
    w: Writer,
    reasons: Mapping[int, str],
    *,
    cause: str = "forgotten",
    ended_at: Mapping[int, datetime] | None = None,
    profile: bool = False,
) -> dict[int, str]:
    """Move the user's memories with these keys into the archive, each with its reason (in its
    event, of the `cause`, and its archive row), inside the unit `w` (its lock taken: what is
    read here stays true until it commits); `ended_at`: when each stopped being true (a
    superseded fact). Pinned memories, profile ones unless `profile` (consolidation: another
    fact says what it said), and keys that are not the user's (or gone meanwhile), are left
    alone. The words of each memory moved, by key."""
    action = CAUSES[cause]
    ended = ended_at or {}
    wanted = list(reasons)
    moved: dict[int, str] = {}
    stamp = now()
    for start in range(0, len(wanted), FORGET_CHUNK):
        chunk = wanted[start : start + FORGET_CHUNK]
        rows = list(
            (await w.execute(
                select(Memory).where(
                    Memory.user_id == w.user_id, Memory.key.in_(chunk),
                    Memory.pinned.is_(False), *(() if profile else (Memory.profile.is_(False),)),
                )
            )).scalars()
        )  # fmt: skip
        if not rows:
            continue
        ids = [row.id for row in rows]
        linked: dict[str, list[str]] = {i: [] for i in ids}
        links = await w.execute(
            select(MemoryLink.fact_id, MemoryLink.episode_id).where(
                MemoryLink.user_id == w.user_id,
                or_(MemoryLink.fact_id.in_(ids), MemoryLink.episode_id.in_(ids)),
            )
        )
        pairs = cast("list[tuple[str, str]]", links.all())
        facts = {row.id for row in rows if row.type != MemoryType.EPISODE.value}
        if words := {e for f, e in pairs if f in facts}:
            # The words a fact that leaves came from are not given to the Manager once more
            # as words that gave no fact (it would learn them again).
            await w.execute(
                w.insert(ProcessedTurn).on_conflict_do_nothing(),
                [{"user_id": w.user_id, "fingerprint": m, "created_at": stamp}
                 for m in distil_marks(sorted(words))],
            )  # fmt: skip
        for fact_id, episode_id in pairs:
            if fact_id in linked:
                linked[fact_id].append(episode_id)
            if episode_id in linked:
                linked[episode_id].append(fact_id)
        await w.execute(
            delete(MemoryLink).where(
                MemoryLink.user_id == w.user_id,
                or_(MemoryLink.fact_id.in_(ids), MemoryLink.episode_id.in_(ids)),
            )
        )
        await w.execute(insert(ForgottenMemory), [
            {"id": row.id, "user_id": w.user_id, "content": row.content, "type": row.type,
             "meta": dict(row.meta or {}), "source": row.source, "created_at": row.created_at,
             "observed_at": row.observed_at, "recall_count": row.recall_count,
             "last_recalled_at": row.last_recalled_at, "index_text": row.index_text,
             "links": linked[row.id], "reason": reasons[row.key], "forgotten_at": stamp,
             "cause": cause, "ended_at": ended.get(row.key)}
            for row in rows
        ])  # fmt: skip
        for row in rows:
            w.note(row.id, action, before=row.content, detail=reasons[row.key])
        keys = [row.key for row in rows]
        await w.execute(delete(Memory).where(Memory.key.in_(keys)))
        moved.update((row.key, row.content) for row in rows)
    return moved


async def take_back(w: Writer, memory_id: str) -> ForgottenMemory | None:
    """Take the user's archived memory `memory_id` out of the archive, inside the unit `w` that
    puts it back (its lock taken); None when the archive has no such memory of the user."""
    row = await w.execute(
        select(ForgottenMemory).where(
            ForgottenMemory.user_id == w.user_id, ForgottenMemory.id == memory_id
        )
    )
    found = row.scalar_one_or_none()
    if found is not None:
        await w.execute(delete(ForgottenMemory).where(ForgottenMemory.key == found.key))
    return found


async def relink(w: Writer, memory: Memory, ids: list[str]) -> list[tuple[int, int]]:
    """Link the memory put back (inserted by `w`) to those of `ids` the user still holds: an
    episode to facts, a fact to episodes. The (fact key, episode key) pairs linked."""
    others = await w.rows(ids)
    episode = memory.type == MemoryType.EPISODE.value
    pairs: list[tuple[int, int]] = []
    for other in others.values():
        if (other.type == MemoryType.EPISODE.value) == episode:
            continue  # links join a fact and an episode
        fact, source = (other, memory) if episode else (memory, other)
        w.link(fact.id, source.id)
        pairs.append((fact.key, source.key))
    return pairs


def as_forgotten(row: ForgottenMemory) -> Forgotten:
    return _forgotten(row)
