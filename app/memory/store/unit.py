"""One unit of work on a user's memories: the one way memories are written.

Every write (the memory API, an import, the Manager's decisions) goes through
:meth:`app.memory.store.memories.MemoryStore.writing`::

    async with store.writing(user_id, MemorySource.MANAGER, job_id=job_id) as w:
        rows = await w.rows(ids)
        w.create(Memory(...))
        w.update(row, before=old_content)
        await w.delete(row)

Promises:

- the unit is one transaction (:func:`app.memory.store.db.writing`): all of it or none;
- each create, update and delete records its history event in that transaction
  (:mod:`app.memory.store.events`), with the unit's actor and job;
- a memory deleted takes its provenance links (:class:`~app.memory.store.tables.MemoryLink`)
  with it, in the same transaction; a fact deleted (:meth:`Writer.delete`: every path) takes
  the episodes it was written from and the memories that say the same;
- when anything changed, the user's version is bumped once and every row created or updated is
  stamped with it (``seq``): a cache built at version N is stale exactly when the version is no
  longer N. A unit that changed nothing bumps nothing. After the block, :attr:`Writer.version`
  is the version the unit committed (the current one when nothing changed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Executable, Result, delete, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.memory.store import events
from app.memory.store.db import insert_for
from app.memory.store.queries import own, version_of
from app.memory.store.records import now
from app.memory.store.tables import (
    EventAction,
    Memory,
    MemoryLink,
    MemorySource,
    MemoryType,
    UserState,
)

_INSERTED = (
    *("id", "user_id", "content", "type", "meta", "source", "pinned", "profile", "created_at"),
    *("updated_at", "observed_at", "recall_count", "last_recalled_at", "embedding"),
    *("embedding_model", "index_text"),
)
"""What :meth:`Writer.insert_new` inserts of a new row (its ``seq`` is the unit's version)."""


class Writer:
    """The handle a unit of work gives its block (see the module docstring)."""

    def __init__(
        self, session: AsyncSession, user_id: str, actor: MemorySource, job_id: str | None
    ) -> None:
        self._session = session
        self.user_id = user_id
        self._actor = actor
        self._job_id = job_id
        self._written: list[Memory] = []
        self._linked: set[tuple[str, str]] = set()
        self._changed = False
        self._bumped: int | None = None
        self.gone: dict[str, int] = {}
        """The id and key of every memory :meth:`delete` deleted, in order."""
        self.version: int | None = None
        """The version the unit committed; set when the block ends."""

    async def rows(self, memory_ids: Sequence[str]) -> dict[str, Memory]:
        """The user's memories with these ids, by id (other users' are never returned)."""
        if not memory_ids:
            return {}
        query = own(self.user_id).where(Memory.id.in_(memory_ids))
        return {row.id: row for row in await self._session.scalars(query)}

    def create(self, row: Memory, *, detail: str | None = None) -> None:
        """Add a new memory of this user."""
        self._session.add(row)
        self._wrote(row)
        self._event(row.id, EventAction.CREATED, after=row.content, detail=detail)

    def link(self, fact_id: str, episode_id: str) -> None:
        """Record that the fact `fact_id` was written from the episode `episode_id` (both this
        user's), once per unit however often said (a fact written, then updated, is named twice)."""
        if (fact_id, episode_id) not in self._linked:
            self._linked.add((fact_id, episode_id))
            self._session.add(MemoryLink(user_id=self.user_id, fact_id=fact_id,
                                         episode_id=episode_id, created_at=now()))  # fmt: skip

    def note(
        self, memory_id: str, action: EventAction, *, before: str | None, detail: str | None
    ) -> None:
        """Record a change this unit made by statement (:meth:`execute`), with its event."""
        self._changed = True
        self._event(memory_id, action, before=before, detail=detail)

    def stamp(self, row: Memory) -> None:
        """Stamp `row` as written by this unit, with no event (its links changed): reread."""
        if row not in self._written:
            self._wrote(row)

    def update(self, row: Memory, *, before: str, detail: str | None = None) -> None:
        """`row` (one of :meth:`rows`) was changed in place; `before` is its former content,
        `detail` says what else changed."""
        row.updated_at = now()
        self._wrote(row)
        self._event(row.id, EventAction.UPDATED, before=before, after=row.content, detail=detail)

    async def delete(self, row: Memory, *, same: Mapping[int, float] | None = None) -> list[Memory]:
        """Delete `row` (one of :meth:`rows`); a fact takes what would say it again: the episodes
        it was written from, also those that gave other facts (they hold the forgotten words),
        and `same` (key -> cosine: :func:`app.memory.search.restating.restatements`) with their
        episodes. Never a pinned memory, nor one this unit wrote; each has a ``deleted`` event
        saying why. An episode goes alone. What went with `row` (none when it went already)."""
        if row.id in self.gone:
            return []
        along = await self._along(row, same or {}) if row.type != MemoryType.EPISODE.value else []
        await self._unlink(Memory.id.in_([row.id, *(m.id for m, _ in along)]))
        for memory, why in [(row, None), *along]:
            await self._session.delete(memory)
            self.gone[memory.id] = memory.key
            self._event(memory.id, EventAction.DELETED, before=memory.content, detail=why)
        self._changed = True
        return [memory for memory, _ in along]

    async def _along(self, row: Memory, same: Mapping[int, float]) -> list[tuple[Memory, str]]:
        """What goes with the fact `row` (:meth:`delete`), each with why (its own episodes
        first, then what says the same, then the episodes of those)."""
        spared = {row.id, *self.gone, *(r.id for r in self._written)}
        alike: list[Memory] = []
        if same:
            query = own(self.user_id).where(Memory.key.in_(list(same)), Memory.pinned.is_(False))
            alike = [m for m in await self._session.scalars(query) if m.id not in spared]
        facts = [row.id, *(m.id for m in alike if m.type != MemoryType.EPISODE.value)]
        linked = (
            select(Memory, MemoryLink.fact_id)
            .join(MemoryLink, MemoryLink.episode_id == Memory.id)
            .where(Memory.user_id == self.user_id, MemoryLink.user_id == self.user_id)
            .where(MemoryLink.fact_id.in_(facts), Memory.pinned.is_(False))
        )
        episodes = [(m, f) for m, f in await self._session.execute(linked) if m.id not in spared]
        found: dict[str, tuple[Memory, str]] = {}
        for memory, _ in (e for e in episodes if e[1] == row.id):
            found[memory.id] = (memory, f"an episode {row.id} was written from: deleted with it")
        for memory in alike:
            why = f"says what {row.id} said (cosine {same[memory.key]:.2f}): deleted with it"
            found.setdefault(memory.id, (memory, why))
        for memory, fact_id in episodes:
            why = (f"an episode {fact_id} was written from, which says what {row.id} said: "
                   f"deleted with {row.id}")  # fmt: skip
            found.setdefault(memory.id, (memory, why))
        return list(found.values())

    async def delete_matching(self, condition: Any) -> list[int]:
        """Delete the user's memories matching `condition` (all of them when None); their keys."""
        query = select(Memory.key, Memory.id, Memory.content).where(Memory.user_id == self.user_id)
        if condition is not None:
            query = query.where(condition)
        found = list(await self._session.execute(query))
        if found:
            keys = [key for key, _, _ in found]
            await self._unlink(condition)
            await self._session.execute(delete(Memory).where(Memory.key.in_(keys)))
            self._changed = True
            for _, memory_id, content in found:
                self._event(memory_id, EventAction.DELETED, before=content)
        return [key for key, _, _ in found]

    async def _unlink(self, condition: Any) -> None:
        """Delete the links of the user's memories matching `condition` (all when None), as
        fact or as episode: before the memories themselves, which the condition reads."""
        query = delete(MemoryLink).where(MemoryLink.user_id == self.user_id)
        if condition is not None:
            ids = select(Memory.id).where(Memory.user_id == self.user_id, condition)
            query = query.where(or_(MemoryLink.fact_id.in_(ids), MemoryLink.episode_id.in_(ids)))
        await self._session.execute(query)

    async def hand_over(self, target: Writer) -> list[int]:
        """Give every memory of this unit's user to `target`'s user (another unit in the same
        transaction): the keys moved. Both users' versions are bumped first (in user order, so
        two opposite moves cannot deadlock), so no write of either user lands between the read
        and the move, and given back when there was nothing to move; each memory moved gets a
        ``moved`` event naming where it came from (the events before it are the caller's to
        move: :meth:`app.memory.store.memories.MemoryStore.move`)."""
        first, second = sorted((self, target), key=lambda w: w.user_id)
        await first._bump()
        await second._bump()
        query = select(Memory.key, Memory.id, Memory.content).where(Memory.user_id == self.user_id)
        found = list(await self._session.execute(query))
        if not found:
            await self._unbump()
            await target._unbump()
            return []
        keys = [key for key, _, _ in found]
        await self._session.execute(  # all of them: both users are locked since the read
            update(Memory)
            .where(Memory.user_id == self.user_id)
            .values(user_id=target.user_id, seq=target._bumped)
        )
        self._changed = target._changed = True
        for _, memory_id, content in found:
            target._event(
                memory_id, EventAction.MOVED, before=content, after=content,
                detail=f"moved from user {self.user_id!r}",
            )  # fmt: skip
        return keys

    async def insert_new(
        self, rows: Sequence[Memory], details: Mapping[str, str] | None = None
    ) -> set[str]:
        """Insert the rows, skipping those whose id exists by now (a concurrent write's); the
        ids inserted, each with its event (and its detail, by id, from `details`). The version
        is bumped first (its lock orders the inserts of concurrent writers) and given back when
        nothing was inserted."""
        version = await self._bump()
        statement = (
            insert_for(self._session)(Memory)
            .on_conflict_do_nothing(index_elements=[Memory.id])
            .returning(Memory.id, Memory.key)
        )
        values = [{c: getattr(row, c) for c in _INSERTED} | {"seq": version} for row in rows]
        by_id = {row.id: row for row in rows}
        inserted = set()
        for memory_id, key in await self._session.execute(statement, values):
            row = by_id[memory_id]
            row.key, row.seq = key, version
            inserted.add(memory_id)
            # The writer is the actor: an import that puts a memory's source back (manager...)
            # is still an import in the history.
            self._event(
                memory_id, EventAction.CREATED, self._actor,
                after=row.content, detail=(details or {}).get(memory_id),
            )  # fmt: skip
        self._changed = self._changed or bool(inserted)
        if not inserted:  # nothing written after all: the version must not move
            await self._unbump()
        return inserted

    async def lock(self) -> None:
        """Take the user's write lock now, until the unit ends (it bumps the version, which is
        given back at the end when nothing changed): a write of the same user elsewhere, in any
        process, waits until this one commits, so what this unit reads next stays true."""
        await self._bump()

    @property
    def insert(self) -> Any:
        """The database's INSERT, with ``ON CONFLICT`` (for :meth:`execute`)."""
        return insert_for(self._session)

    async def committing(self) -> int:
        """The version this unit commits if it ends now (its lock taken: :meth:`lock`)."""
        if self._bumped is None:
            return await version_of(self._session, self.user_id)
        return self._bumped if self._changed else self._bumped - 1

    async def execute(self, statement: Executable, params: Any = None) -> Result[Any]:
        """Another statement in the unit's transaction (the Manager's queue deletes the job it
        applies here, so that the job and its effects commit together)."""
        return await self._session.execute(statement, params)

    async def finish(self) -> None:
        """Bump and stamp (when anything changed): called as the block ends, before commit."""
        if self._changed and self._bumped is None:
            await self._bump()
        elif not self._changed and self._bumped is not None:  # locked, then wrote nothing
            await self._unbump()
        if self._bumped is not None:
            for row in self._written:
                row.seq = self._bumped
            self.version = self._bumped
        else:
            self.version = await version_of(self._session, self.user_id)
        await self._session.flush()

    def _wrote(self, row: Memory) -> None:
        self._written.append(row)
        self._changed = True

    def _event(
        self,
        memory_id: str,
        action: EventAction,
        actor: MemorySource | None = None,
        **fields: str | None,
    ) -> None:
        events.record(
            self._session, self.user_id, memory_id, action, actor or self._actor,
            job_id=self._job_id, **fields,
        )  # fmt: skip

    async def _bump(self) -> int:
        """version += 1 for the user, creating the row on the first write (one atomic upsert:
        two processes writing a new user's first memories cannot both insert it; the write lock
        it takes orders the user's writes across processes)."""
        if self._bumped is None:
            statement = (
                insert_for(self._session)(UserState)
                .values(user_id=self.user_id, version=1)
                .on_conflict_do_update(
                    index_elements=[UserState.user_id], set_={"version": UserState.version + 1}
                )
                .returning(UserState.version)
            )
            self._bumped = int((await self._session.execute(statement)).scalar_one())
        return self._bumped

    async def _unbump(self) -> None:
        """Undo this unit's own bump (exactly: the lock it took is held until the transaction
        ends, so no other write bumped since)."""
        statement = (
            update(UserState)
            .where(UserState.user_id == self.user_id)
            .values(version=UserState.version - 1)
        )
        await self._session.execute(statement)
        self._bumped = None
