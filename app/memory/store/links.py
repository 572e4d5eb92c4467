"""Provenance links (:class:`~app.memory.store.tables.MemoryLink`: a fact was written from an
episode) read and put back, every query scoped to one user.

- the index reads them by key (:func:`key_links`: the search indexes hold keys);
- the API shows them by id (:func:`linked_ids`: for each memory shown, the memories linked to it,
  one query per response, read in chunks);
- a delete reads those of what it may delete before it deletes them (:func:`before_delete`),
  so that its answer can put them back;
- an import puts back those whose both ends are the user's (:func:`restore`), in the import's
  unit of work, the direction given by the memories' types (fact -> episode).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Select, or_, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from app.memory.store.tables import Memory, MemoryLink, MemoryType

if TYPE_CHECKING:  # the unit reads through the queries, which read links from here
    from app.memory.store.unit import Writer

LINK_CHUNK = 1000
"""Ids or keys per query: a bound parameter list stays small."""


async def key_links(
    session: AsyncSession, user_id: str, episode_keys: Sequence[int] | None = None
) -> list[tuple[int, int]]:
    """The user's links (fact key, episode key): all of them, or those of `episode_keys` (read
    in chunks)."""
    fact, episode = aliased(Memory), aliased(Memory)
    query = (
        select(fact.key, episode.key)
        .select_from(MemoryLink)
        .join(fact, fact.id == MemoryLink.fact_id)
        .join(episode, episode.id == MemoryLink.episode_id)
        .where(MemoryLink.user_id == user_id)
    )
    if episode_keys is None:
        return [(int(f), int(e)) for f, e in await session.execute(query)]
    found: list[tuple[int, int]] = []
    keys = list(episode_keys)
    for start in range(0, len(keys), LINK_CHUNK):
        chunk = query.where(episode.key.in_(keys[start : start + LINK_CHUNK]))
        found += [(int(f), int(e)) for f, e in await session.execute(chunk)]
    return found


async def linked_ids(
    session: AsyncSession, user_id: str, memory_ids: Sequence[str]
) -> dict[str, list[str]]:
    """For each of these ids, the ids linked to it: a fact's episodes, an episode's facts
    (oldest link first; an id without links is left out)."""
    wanted = list(dict.fromkeys(memory_ids))
    found: dict[str, list[str]] = {}
    for start in range(0, len(wanted), LINK_CHUNK):
        chunk = wanted[start : start + LINK_CHUNK]
        collect(found, await session.execute(links_of(user_id, chunk)), set(chunk))
    return found


def links_of(user_id: str, ids: Sequence[str]) -> Select[str, str]:
    """The (fact id, episode id) links of the user touching any of `ids`, oldest first."""
    return (
        select(MemoryLink.fact_id, MemoryLink.episode_id)
        .where(MemoryLink.user_id == user_id)
        .where(or_(MemoryLink.fact_id.in_(ids), MemoryLink.episode_id.in_(ids)))
        .order_by(MemoryLink.created_at, MemoryLink.fact_id, MemoryLink.episode_id)
    )


async def before_delete(
    w: Writer, memory_ids: Sequence[str], same: Collection[int]
) -> dict[str, list[str]]:
    """What :func:`linked_ids` says, read in a delete's unit before it deletes anything, of
    every memory deleting `memory_ids` may take (:meth:`Writer.delete`): these, the memories
    with the keys `same` (what restates them) and the episodes any of those was written from.
    One query."""
    asked = select(Memory.id).where(Memory.user_id == w.user_id, Memory.key.in_(list(same)))
    named = or_(MemoryLink.fact_id.in_(list(memory_ids)), MemoryLink.fact_id.in_(asked))
    episodes = select(MemoryLink.episode_id).where(MemoryLink.user_id == w.user_id, named)
    query = (
        select(MemoryLink.fact_id, MemoryLink.episode_id)
        .where(MemoryLink.user_id == w.user_id)
        .where(
            or_(
                named,
                MemoryLink.episode_id.in_(list(memory_ids)),
                MemoryLink.episode_id.in_(asked),  # an episode that says it too goes along
                MemoryLink.episode_id.in_(episodes),
            )
        )
        .order_by(MemoryLink.created_at, MemoryLink.fact_id, MemoryLink.episode_id)
    )
    found: dict[str, list[str]] = {}
    collect(found, await w.execute(query), None)
    return found


def collect(found: dict[str, list[str]], rows: Iterable[Any], only: set[str] | None) -> None:
    """Each (fact id, episode id) row added to `found` both ways, for the ids in `only` (all
    when None), in the rows' order."""
    for fact_id, episode_id in rows:
        for one, other in ((fact_id, episode_id), (episode_id, fact_id)):
            if only is None or one in only:
                found.setdefault(one, []).append(other)


async def restore(
    w: Writer, pairs: Sequence[tuple[str, str]], ids: Mapping[str, str]
) -> list[tuple[int, int]]:
    """Link the memories of each pair (two ids, either order) in the unit `w`: a fact to an
    episode, when both are the user's (`ids`: the id a memory of this write got, by the id
    it was named by; other ids are taken as they are). A pair of two facts or two episodes,
    or naming a memory the user has not, is dropped; a link there already is kept. The
    (fact key, episode key) of every pair linked, also those linked before."""
    named = [(ids.get(a, a), ids.get(b, b)) for a, b in pairs]
    if not named:
        return []
    await w.lock()  # before the look at the links: a concurrent import of them waits here
    ends = list({i for pair in named for i in pair})
    rows: dict[str, Any] = {}
    for start in range(0, len(ends), LINK_CHUNK):
        found = await w.execute(
            select(Memory.id, Memory.key, Memory.type).where(
                Memory.user_id == w.user_id, Memory.id.in_(ends[start : start + LINK_CHUNK])
            )
        )
        rows |= {row.id: row for row in found}
    wanted: dict[tuple[str, str], tuple[int, int]] = {}
    for a, b in named:
        one, other = rows.get(a), rows.get(b)
        if one is None or other is None:
            continue  # unknown, or another user's: never linked, never said
        if one.type == MemoryType.EPISODE.value:
            one, other = other, one
        if one.type != MemoryType.EPISODE.value and other.type == MemoryType.EPISODE.value:
            wanted[(one.id, other.id)] = (one.key, other.key)
    facts = list({f for f, _ in wanted})
    known: set[tuple[str, str]] = set()
    for start in range(0, len(facts), LINK_CHUNK):
        there = await w.execute(
            select(MemoryLink.fact_id, MemoryLink.episode_id).where(
                MemoryLink.user_id == w.user_id,
                MemoryLink.fact_id.in_(facts[start : start + LINK_CHUNK]),
            )
        )
        known |= {(row.fact_id, row.episode_id) for row in there}
    added = [pair for pair in wanted if pair not in known]
    for fact_id, episode_id in added:
        w.link(fact_id, episode_id)
    # An episode stored before this unit that gets a link is stamped as written by it: another
    # process's index catches up by the rows written since its version, with their links.
    touched = list({episode_id for _, episode_id in added})
    for start in range(0, len(touched), LINK_CHUNK):
        for row in (await w.rows(touched[start : start + LINK_CHUNK])).values():
            w.stamp(row)
    return list(wanted.values())


Rekey = tuple[str, bytes, str]
"""An episode's new index key, that key's embedding, and the embedding's model."""


async def rekey(w: Writer, keys: Mapping[str, Rekey]) -> list[Memory]:
    """Give the user's episodes named in `keys` their new index keys (facts were linked to them:
    an import's, :mod:`app.memory.search.provenance`, or a retried job's), in the unit `w`; an
    episode whose key is that already is left alone. No event: its words are unchanged. The
    episodes still there (one gone since is not brought back)."""
    rows = (await w.rows(list(keys))).values()  # none read when there are no keys
    episodes = [row for row in rows if row.type == MemoryType.EPISODE.value]
    for row in episodes:
        text, embedding, model = keys[row.id]
        index_text = text if text != row.content else None  # found by its words alone
        if row.index_text != index_text:
            row.index_text, row.embedding, row.embedding_model = index_text, embedding, model
            w.stamp(row)
    return episodes
