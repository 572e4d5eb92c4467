"""The idle work's reads and writes (:mod:`app.memory.learning.idle`): the user's facts as
consolidation weighs them, the episodes no fact came from (:mod:`app.memory.learning.distilling`),
the memories enrichment gives a context (:mod:`app.memory.learning.enrichment`, :func:`rekeyed`),
and the two ways a fact leaves for another (:mod:`app.memory.learning.consolidation`), each in a
unit of work whose lock is taken first (what was read stays true until it commits):

- :func:`merge`: facts that say the same go into one (the survivor, which keeps its id and
  takes the merged words); the others leave for the archive as ``merged``, each event naming
  the survivor; the episodes they were written from are linked to the survivor (provenance
  follows); the survivor is a profile fact if one of them was;
- :func:`supersede`: a fact that stopped being true leaves for the archive as ``superseded``,
  with the day it ended (the newer fact's saying), never recalled again; a profile mark
  passes to the newer fact.

Pinned facts never leave (they may survive a merge); either can be put back from the archive
(:mod:`.archive`), same id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import literal, select

from app.memory.store.archive import DISTIL, Execute, forget
from app.memory.store.records import aware, in_utc
from app.memory.store.tables import Memory, MemoryLink, MemoryType, ProcessedTurn
from app.memory.store.unit import Writer


@dataclass(frozen=True, slots=True)
class Fact:
    """One of the user's facts, as consolidation weighs it."""

    key: int
    id: str
    content: str
    pinned: bool
    profile: bool
    observed_at: datetime
    seq: int
    embedding: bytes | None
    embedding_model: str | None


async def facts(execute: Execute, user_id: str) -> list[Fact]:
    """Every fact of the user (no episode), oldest said first."""
    found = await execute(
        select(Memory.key, Memory.id, Memory.content, Memory.pinned, Memory.profile,
               Memory.observed_at, Memory.seq, Memory.embedding, Memory.embedding_model)
        .where(Memory.user_id == user_id, Memory.type != MemoryType.EPISODE.value)
        .order_by(Memory.observed_at, Memory.key)
    )  # fmt: skip
    rows = cast("list[tuple[Any, ...]]", found.all())
    return [
        Fact(int(key), str(i), str(content), bool(pinned), bool(profile), aware(observed),
             int(seq or 0), embedding, model)
        for key, i, content, pinned, profile, observed, seq, embedding, model in rows
    ]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Lone:
    """An episode no fact was written from."""

    id: str
    content: str
    created_at: datetime
    """When it was written: a job's episodes share it."""
    observed_at: datetime
    seq: int


async def lone_episodes(execute: Execute, user_id: str, since: int) -> list[Lone]:
    """The user's episodes written after version `since` that no fact links to and that were
    never given to the Manager once more, nor gave a fact that left (their marks), in the order
    they were written."""
    linked = select(MemoryLink.episode_id).where(MemoryLink.user_id == user_id)
    marked = select(ProcessedTurn.fingerprint).where(
        ProcessedTurn.user_id == user_id, ProcessedTurn.fingerprint.like(f"{DISTIL}%")
    )
    found = await execute(
        select(Memory.id, Memory.content, Memory.created_at, Memory.observed_at, Memory.seq)
        .where(Memory.user_id == user_id, Memory.type == MemoryType.EPISODE.value,
               Memory.seq > since, Memory.id.not_in(linked),
               (literal(DISTIL) + Memory.id).not_in(marked))
        .order_by(Memory.seq, Memory.key)
    )  # fmt: skip
    rows = cast("list[tuple[Any, ...]]", found.all())
    return [Lone(str(i), str(c), aware(w), aware(o), int(q or 0)) for i, c, w, o, q in rows]


@dataclass(frozen=True, slots=True)
class Keyed:
    """A memory as enrichment reads it: what it is found by."""

    id: str
    content: str
    key: str
    """Its index key: what it is found by (its content, unless an episode's words and facts)."""
    created_at: datetime
    """When it was written: one unit's memories share it."""
    observed_at: datetime
    seq: int


async def fresh_keys(execute: Execute, user_id: str, since: int) -> list[Keyed]:
    """The user's memories written after version `since`, in the order they were written."""
    found = await execute(
        select(Memory.id, Memory.content, Memory.index_text, Memory.created_at,
               Memory.observed_at, Memory.seq)
        .where(Memory.user_id == user_id, Memory.seq > since)
        .order_by(Memory.seq, Memory.key)
    )  # fmt: skip
    rows = cast("list[tuple[Any, ...]]", found.all())
    return [
        Keyed(str(i), str(c), str(k or c), aware(w), aware(o), int(q or 0))
        for i, c, k, w, o, q in rows
    ]


async def rekeyed(w: Writer, keys: Sequence[tuple[Keyed, str, bytes, str]]) -> int:
    """Give these memories their new index keys (each with the key's embedding and its model),
    inside the unit `w`: those whose words changed since they were read are left alone (their
    key was made anew). No event: their words are unchanged. How many were given theirs."""
    rows = await w.rows([k.id for k, _, _, _ in keys])
    given = 0
    for read, key, embedding, model in keys:
        row = rows.get(read.id)
        if (
            row is None
            or row.content != read.content
            or (row.index_text or row.content) != read.key
        ):
            continue
        row.index_text = key if key != row.content else None
        row.embedding, row.embedding_model = embedding, model
        w.stamp(row)
        given += 1
    return given


@dataclass(frozen=True, slots=True)
class Merged:
    survivor: str
    gone: list[str]
    """The ids of the facts that left into the survivor."""


async def merge(
    w: Writer,
    survivor_id: str,
    others: Sequence[str],
    content: str,
    *,
    embedding: bytes,
    model: str,
    read: Mapping[str, str] | None = None,
) -> Merged | None:
    """Merge the facts `others` into `survivor_id` (the module docstring), which now says
    `content` (`embedding`, of `model`, is that text's); those gone, pinned or changed
    meanwhile (their words are no longer `read`'s) stay out of it. None when the survivor is
    gone or changed, or none of the others is left to merge."""
    await w.lock()
    rows = await w.rows([survivor_id, *others])
    rows = {i: row for i, row in rows.items() if read is None or read.get(i) == row.content}
    survivor = rows.get(survivor_id)
    leaving = [rows[i] for i in others if i in rows and i != survivor_id and not rows[i].pinned]
    if survivor is None or survivor.type == MemoryType.EPISODE.value or not leaving:
        return None
    if survivor.pinned and content != survivor.content:
        return None  # pinned meanwhile: it keeps its words
    leaving = [row for row in leaving if row.type != MemoryType.EPISODE.value]
    ids = [row.id for row in leaving]
    before = survivor.content
    marked = any(row.profile for row in leaving) and not survivor.profile
    if content != before or marked:
        if content != before:
            survivor.content, survivor.index_text = content, None
            survivor.embedding, survivor.embedding_model = embedding, model
        survivor.profile = survivor.profile or marked
        detail = f"merged with {', '.join(ids)}" + ("; profile" if marked else "")
        w.update(survivor, before=before, detail=detail)
    await _hand_links(w, ids, survivor_id)
    said = f"merged into {survivor_id}: {content}"
    await forget(w, {row.key: said for row in leaving}, cause="merged", profile=True)
    return Merged(survivor_id, ids)


async def supersede(
    w: Writer, older_id: str, newer_id: str, *, read: Mapping[str, str] | None = None
) -> bool:
    """The fact `older_id` stopped being true when `newer_id` was said: it leaves for the
    archive with that day (the module docstring). False when either is gone or changed (its
    words are no longer `read`'s), the older is pinned, or was not said before the newer."""
    await w.lock()
    rows = await w.rows([older_id, newer_id])
    rows = {i: row for i, row in rows.items() if read is None or read.get(i) == row.content}
    older, newer = rows.get(older_id), rows.get(newer_id)
    if older is None or newer is None or older.pinned or older_id == newer_id:
        return False
    ended = in_utc(aware(newer.observed_at))
    if aware(older.observed_at) >= ended:
        return False
    if older.profile and not newer.profile:
        newer.profile = True
        w.update(newer, before=newer.content, detail=f"profile (from {older_id}, superseded)")
    why = f"no longer true since {ended.date().isoformat()}: {newer.content} ({newer_id})"
    moved = await forget(w, {older.key: why}, cause="superseded", ended_at={older.key: ended},
                         profile=True)  # fmt: skip
    return bool(moved)


async def _hand_links(w: Writer, from_ids: Sequence[str], to_id: str) -> None:
    """Link `to_id` to the episodes the facts `from_ids` were written from (before those go)."""
    found = await w.execute(
        select(MemoryLink.fact_id, MemoryLink.episode_id).where(
            MemoryLink.user_id == w.user_id, MemoryLink.fact_id.in_([*from_ids, to_id])
        )
    )
    pairs = cast("list[tuple[str, str]]", found.all())
    held = {episode for fact, episode in pairs if fact == to_id}
    handed = list(dict.fromkeys(e for fact, e in pairs if fact != to_id and e not in held))
    for episode in handed:
        w.link(to_id, episode)
    # An episode given a link is stamped as written here: another process's index catches up
    # by the rows written since its version, with their links.
    for row in (await w.rows(handed)).values():
        w.stamp(row)
