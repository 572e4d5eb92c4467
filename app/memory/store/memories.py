"""The memory store: the source of truth, every operation scoped to one user.

Promises:

- every method takes the user id, and never reads, changes or counts another user's memories;
- every write is one unit of work (:meth:`MemoryStore.writing`, :mod:`app.memory.store.unit`):
  it bumps that user's change sequence (:meth:`MemoryStore.version`) once, in its transaction,
  stamps the rows it wrote with the new value (``seq``) and leaves an event per change; a write
  returns the version it committed. A cache built at version N is stale exactly when the
  version is no longer N, whichever process wrote, and catches up with
  :meth:`MemoryStore.snapshot`;
- recall bookkeeping (:meth:`MemoryStore.mark_recalled`) and re-embedding
  (:meth:`MemoryStore.set_embeddings`) change no content and bump nothing;
- results are plain frozen :class:`~app.memory.store.records.MemoryRecord` values, safe to keep
  after the session closes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Unpack

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from app.memory.store import direct, events
from app.memory.store.archive_book import Archive
from app.memory.store.claims import IdTaken, found, own_ids, same_text
from app.memory.store.db import writing
from app.memory.store.images import IndexImages
from app.memory.store.links import LINK_CHUNK, Rekey, before_delete, rekey, restore
from app.memory.store.marks import RecallMarks
from app.memory.store.queries import MemoryQueries, own
from app.memory.store.records import (
    Changes,
    MemoryRecord,
    NewMemory,
    Removed,
    Written,
    describe_changes,
    in_utc,
    new_row,
    now,
    record_of,
)
from app.memory.store.tables import (
    Memory,
    MemorySource,
    MemoryType,
)
from app.memory.store.unit import Writer
from app.memory.store.whole import WholeUser

_CHANGEABLE = frozenset(Changes.__annotations__)


class MemoryStore(MemoryQueries, WholeUser, Archive, IndexImages):
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self.sessions = async_sessionmaker(engine, expire_on_commit=False)
        """For reads, and for the Manager's queue (its own tables); memories are written only
        through :meth:`writing`."""
        self._marks = RecallMarks(self.sessions)

    # --- writes (each a unit of work: app/memory/store/unit.py) -----------------------------

    @asynccontextmanager
    async def writing(
        self, user_id: str, actor: MemorySource, *, job_id: str | None = None
    ) -> AsyncIterator[Writer]:
        """A unit of work on the user's memories (:mod:`app.memory.store.unit`): one
        transaction, an event per change, the version bumped once when anything changed."""
        async with writing(self.sessions) as session:
            writer = Writer(session, user_id, actor, job_id)
            yield writer
            await writer.finish()

    async def add(
        self,
        user_id: str,
        items: Sequence[NewMemory],
        *,
        job_id: str | None = None,
        rename_taken: bool = False,
        once: bool = False,
        links: Sequence[tuple[str, str]] = (),
        rekeyed: Mapping[str, Rekey] | None = None,
    ) -> Written:
        """Create memories; an item whose id already exists (for this user) is left as it is and
        returned unchanged (``Written.created`` says which were new), also when a concurrent
        write (another request, another process) created it after this one looked: the insert
        skips ids that exist by then (``ON CONFLICT DO NOTHING``). An id that belongs to another
        user raises :class:`IdTaken`, or with `rename_taken` is replaced by one of this user's
        derived from it (:mod:`app.memory.store.claims`). With `once`, an item with the words of
        one of the user's memories is not created either: that memory is returned, also under
        concurrent writes (the user's write lock is held from the look to the commit). Only
        created memories bump the version and get events. `links`: pairs of ids to link
        (:func:`~app.memory.store.links.restore`), an item named by its id as given, any other
        id as the user's memory; `rekeyed`: new index keys of the user's episodes, by id
        (:func:`~app.memory.store.links.rekey`), given in the same unit of work."""
        attempt = 0
        while True:
            try:
                return await self._add(
                    user_id, items, job_id, rename_taken, once, links, rekeyed or {}
                )
            except IdTaken:  # renamed: another user's write took an id since the look; again
                attempt += 1
                if not rename_taken or attempt == 3:
                    raise

    async def _add(
        self,
        user_id: str,
        items: Sequence[NewMemory],
        job_id: str | None,
        rename_taken: bool,
        once: bool,
        links: Sequence[tuple[str, str]],
        rekeyed: Mapping[str, Rekey],
    ) -> Written:
        stamp = now()
        given = items
        actor = items[0].source if items else MemorySource.API
        async with self.writing(user_id, actor, job_id=job_id) as w:
            if once:
                await w.lock()  # before the look: the same text sent twice at once waits here
            if rename_taken:
                items = await own_ids(w, items)
            existing = await found(w, [item.id for item in items if item.id])
            fresh: dict[str, Memory] = {}
            details: dict[str, str] = {}  # the created events' details, by id
            ids: list[str] = []  # each item's memory
            for item in items:
                if item.id and (item.id in existing or item.id in fresh):
                    ids.append(item.id)  # the same id twice in one batch is one memory
                    continue
                same = await same_text(w, item.content, fresh.values()) if once else None
                if same is not None:
                    existing.setdefault(same.id, same)
                    ids.append(same.id)
                    continue
                row = new_row(user_id, item, stamp)
                fresh[row.id] = row
                ids.append(row.id)
                if item.detail:
                    details[row.id] = item.detail
            inserted: set[str] = set()
            if fresh:
                inserted = await w.insert_new(list(fresh.values()), details)
                raced = [memory_id for memory_id in fresh if memory_id not in inserted]
                if raced:  # committed by another write since the read above: they exist now
                    existing.update(await found(w, raced, expected=True))
            named = {(i.id or ""): got for i, got in zip(given, ids, strict=True)}
            restored = await restore(w, links, named) if links else []
            await rekey(w, rekeyed)
        assert w.version is not None
        rows = existing | {memory_id: fresh[memory_id] for memory_id in inserted}
        created = []
        for memory_id in ids:  # an id twice in the batch: created by its first item only
            created.append(memory_id in inserted)
            inserted.discard(memory_id)
        return Written([record_of(rows[i]) for i in ids], w.version, created, restored)

    async def update(
        self,
        user_id: str,
        memory_id: str,
        *,
        actor: MemorySource = MemorySource.API,
        **changes: Unpack[Changes],
    ) -> Written | None:
        """Change what :class:`Changes` lists (`observed_at` is kept in UTC)."""
        unknown = set(changes) - _CHANGEABLE
        if unknown:
            raise ValueError(f"cannot change {sorted(unknown)}")
        async with self.writing(user_id, actor) as w:
            row = (await w.rows([memory_id])).get(memory_id)
            if row is None:
                return None
            before = row.content
            said = describe_changes(row, changes)
            if "metadata" in changes:
                row.meta = dict(changes["metadata"])
            if "type" in changes:
                row.type = MemoryType(changes["type"]).value
            if "observed_at" in changes:
                row.observed_at = in_utc(changes["observed_at"])
            if "content" in changes:
                row.index_text = None  # found by its words as written (and embedded from them)
            for name in ("content", "pinned", "profile", "embedding", "embedding_model"):
                if name in changes:
                    setattr(row, name, changes[name])
            w.update(row, before=before, detail=said)
        assert w.version is not None
        return Written([record_of(row)], w.version, [False])

    async def delete(
        self,
        user_id: str,
        memory_ids: Sequence[str],
        *,
        actor: MemorySource = MemorySource.API,
        same: Mapping[str, Mapping[int, float]] | None = None,
    ) -> Removed:
        """Delete the user's memories with these ids (unknown ids ignored), each with what goes
        with it (:meth:`~app.memory.store.unit.Writer.delete`; `same`: what restates each)."""
        asked = list(dict.fromkeys(memory_ids))
        along: list[Memory] = []
        async with self.writing(user_id, actor) as w:
            await w.lock()  # before the read: two deletes of one memory must not both delete it
            rows = await w.rows(asked)
            restating = [key for keys in (same or {}).values() for key in keys]
            linked = await before_delete(w, list(rows), restating)
            for row in (rows[memory_id] for memory_id in asked if memory_id in rows):
                along += await w.delete(row, same=(same or {}).get(row.id))
        assert w.version is not None
        ids = [memory_id for memory_id in asked if memory_id in w.gone]
        also = [record_of(row, embedding=False) for row in along if row.id not in rows]
        linked = {memory_id: linked[memory_id] for memory_id in w.gone if memory_id in linked}
        return Removed(list(w.gone.values()), w.version, ids, also, linked)

    async def history(self, user_id: str, memory_id: str) -> list[events.Event]:
        """Every write to one of the user's memories, oldest first, also after its deletion."""
        async with self.sessions() as session:
            return await events.history(session, user_id, memory_id)

    # --- bookkeeping (no version bump) ------------------------------------------------------

    async def mark_recalled(self, user_id: str, keys: Sequence[int]) -> None:
        """recall_count += 1 and last_recalled_at = now for these memories; returns once they
        are committed (coalesced with concurrent calls:
        :class:`~app.memory.store.marks.RecallMarks`)."""
        await self._marks.mark(user_id, keys)

    async def set_embeddings(self, user_id: str, vectors: Sequence[tuple[int, bytes, str]]) -> None:
        """Store (key, embedding, model) for memories whose text did not change."""
        async with writing(self.sessions) as session:
            for key, embedding, model in vectors:
                await session.execute(
                    update(Memory)
                    .where(Memory.user_id == user_id, Memory.key == key)
                    .values(embedding=embedding, embedding_model=model)
                )

    # --- reads ------------------------------------------------------------------------------

    async def get(self, user_id: str, memory_id: str) -> MemoryRecord | None:
        async with self.sessions() as session:
            row = await session.scalar(own(user_id).where(Memory.id == memory_id))
            return record_of(row) if row is not None else None

    async def kinds(
        self, user_id: str, memory_ids: Sequence[str]
    ) -> dict[str, tuple[str, str, int]]:
        """The type, content and key of the user's memories with these ids, by id."""
        wanted = list(dict.fromkeys(memory_ids))
        found: dict[str, tuple[str, str, int]] = {}
        async with self.sessions() as session:
            for start in range(0, len(wanted), LINK_CHUNK):  # a bound parameter list stays small
                query = select(Memory.id, Memory.type, Memory.content, Memory.key).where(
                    Memory.user_id == user_id, Memory.id.in_(wanted[start : start + LINK_CHUNK])
                )
                found |= {i: (t, c, k) for i, t, c, k in await session.execute(query)}
        return found

    async def get_many(self, user_id: str, keys: Sequence[int]) -> dict[int, MemoryRecord]:
        """The user's memories with these keys, by key (embeddings not loaded). Run by the
        driver itself: this is on every search's path (:mod:`app.memory.store.direct`)."""
        found, _ = await direct.records(self._engine, user_id, keys)
        return found

    async def get_many_linked(
        self, user_id: str, keys: Sequence[int]
    ) -> tuple[dict[int, MemoryRecord], dict[str, list[str]]]:
        """:meth:`get_many`, with the ids linked to each memory (:meth:`linked`'s answer), on
        the same connection."""
        return await direct.records(self._engine, user_id, keys, links=True)
