"""Memory operations as the API, the CLI and chat recall use them: the store, the embedder and the
search indexes kept in step.

Every write embeds first (off the event loop), then commits to the store, then applies itself to
this process's index (other processes catch up from the store's change sequence). Every method
takes the user id; nothing here can reach another user's memories.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Unpack

from app.memory.search.cache import IndexCache
from app.memory.search.embedder import TextEmbedder
from app.memory.search.parts import decode, embed_for_store, vector_model
from app.memory.search.provenance import provenance
from app.memory.search.ranked import Hit
from app.memory.search.ranking import Judge, Recalled, Searcher, Shares
from app.memory.search.restating import restatements
from app.memory.store.events import Event
from app.memory.store.memories import MemoryStore
from app.memory.store.records import (
    Changes,
    MemoryRecord,
    Moved,
    NewMemory,
    Removed,
    UserSummary,
    Written,
)
from app.memory.store.tables import MemorySource, MemoryType

logger = logging.getLogger("memproxy.memory")
EXPORT_PAGE = 500


@dataclass(frozen=True, slots=True)
class Found:
    memory: MemoryRecord
    hit: Hit
    linked: Sequence[str] = ()
    """The ids linked to the memory, when the search was asked for them."""


class MemoryService:
    def __init__(
        self,
        store: MemoryStore,
        embedder: TextEmbedder,
        *,
        dense_weight: float = 0.5,
        cache_max_memories: int = 300_000,
        image_min_memories: int = 0,
        ivf_min_vectors: int = 0,
        idle_seconds: float = 0.0,
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.cache = IndexCache(
            store,
            embedder,
            max_memories=cache_max_memories,
            image_min_memories=image_min_memories,
            ivf_min_vectors=ivf_min_vectors,
            idle_seconds=idle_seconds,
        )
        self.searcher = Searcher(self.cache, embedder, dense_weight=dense_weight)
        self._budget_warned = False

    # --- writes -------------------------------------------------------------------------------

    async def add(
        self,
        user_id: str,
        items: Sequence[NewMemory],
        *,
        rename_taken: bool = False,
        once: bool = False,
    ) -> Written:
        """Create memories (embedded in batches); items with an existing id are kept as they are
        (``Written.created`` tells them apart). `rename_taken` and `once`: see
        :meth:`MemoryStore.add` (another user's id imported under one of this user's; a text the
        user has already is not stored twice, also when sent at once from several places)."""
        found = await provenance(self.store, user_id, items)
        items, rekeyed = found.items, list(found.rekeyed.items())
        texts = [item.index_text or item.content for item in items]
        embedded = await embed_for_store(self.embedder, [*texts, *(key for _, key in rekeyed)])
        embedded, keyed = embedded[: len(texts)], embedded[len(texts) :]
        prepared = [
            replace(item, embedding=e.embedding, embedding_model=e.model)
            for item, e in zip(items, embedded, strict=True)
        ]
        keys = {i: (key, e.embedding, e.model) for (i, key), e in zip(rekeyed, keyed, strict=True)}
        written = await self.store.add(
            user_id, prepared, rename_taken=rename_taken, once=once, links=found.links, rekeyed=keys
        )
        fresh = [i for i, created in enumerate(written.created) if created]
        if fresh and not rekeyed:  # else the index catches up with the episodes rekeyed too
            records = [written.records[i] for i in fresh]
            self.cache.written(
                user_id,
                Written(records, written.version, [True] * len(fresh), written.links),
                [embedded[i].vectors for i in fresh],
            )
        return written

    async def update(
        self,
        user_id: str,
        memory_id: str,
        *,
        actor: MemorySource = MemorySource.API,
        **changes: Unpack[Changes],
    ) -> MemoryRecord | None:
        """Change content, type, metadata, pinned, profile or observed_at; new content is
        embedded again. `actor`: who the history says did it."""
        model = vector_model(self.embedder)
        if "content" in changes:
            (embedded,) = await embed_for_store(self.embedder, [changes["content"]])
            changes["embedding"], changes["embedding_model"] = embedded.embedding, embedded.model
        written = await self.store.update(user_id, memory_id, actor=actor, **changes)
        if written is None:
            return None
        (record,) = written.records
        if record.embedding is not None and record.embedding_model == model:
            self.cache.written(user_id, written, [decode(record.embedding, self.embedder.dim)])
        # else: a vector of another model; the index re-embeds it when it catches up
        return record

    async def delete(
        self, user_id: str, memory_ids: Sequence[str], *, actor: MemorySource = MemorySource.API
    ) -> Removed:
        """Delete these memories of the user (unknown ids are ignored): a fact with the episodes
        it was written from and the memories that say the same (:meth:`restatements`), so that
        what is forgotten stays forgotten (:meth:`app.memory.store.unit.Writer.delete`).
        ``Removed.ids``: those asked for that were deleted; ``Removed.also``: the others."""
        same = await self.restatements(user_id, memory_ids)
        deleted = await self.store.delete(user_id, memory_ids, actor=actor, same=same)
        self.cache.deleted(user_id, deleted)
        return deleted

    async def restatements(
        self, user_id: str, memory_ids: Sequence[str]
    ) -> dict[str, dict[int, float]]:
        """For each of these memories that is a fact (not an episode), by id: the user's other
        memories that say what it says, key -> cosine (:mod:`app.memory.search.restating`)."""
        found = await self.store.kinds(user_id, memory_ids)  # one read, not one per id
        facts = {i: (c, k) for i, (t, c, k) in found.items() if t != MemoryType.EPISODE.value}
        if not facts:
            return {}
        index = await self.cache.get(user_id)
        return {
            memory_id: await restatements(index, self.embedder, key, content)
            for memory_id, (content, key) in facts.items()
        }

    async def delete_all(self, user_id: str, *, actor: MemorySource = MemorySource.API) -> int:
        """Delete every memory of the user, facts and episodes, and what is kept about them
        (:meth:`MemoryStore.delete_all`): how many memories."""
        deleted = await self.store.delete_all(user_id, actor=actor)
        self.cache.deleted(user_id, deleted)
        return deleted.count

    async def move(
        self, from_user: str, to_user: str, *, actor: MemorySource = MemorySource.API
    ) -> Moved:
        """Give every memory of `from_user` to `to_user` (:meth:`MemoryStore.move`); the
        ``moved`` events name `actor`."""
        moved = await self.store.move(from_user, to_user, actor=actor)
        self.cache.deleted(from_user, Removed(moved.keys, moved.source_version))
        self.cache.forget(to_user)  # rebuilt with the memories it was given at its next search
        return moved

    # --- reads --------------------------------------------------------------------------------

    async def get(self, user_id: str, memory_id: str) -> MemoryRecord | None:
        return await self.store.get(user_id, memory_id)

    async def page(
        self,
        user_id: str,
        *,
        types: Sequence[MemoryType] = (),
        contains: str | None = None,
        profile: bool | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> tuple[list[MemoryRecord], int]:
        return await self.store.page(
            user_id, types=types, contains=contains, profile=profile, limit=limit, offset=offset
        )

    async def users(self, *, limit: int, offset: int) -> tuple[list[UserSummary], int]:
        """A page of every user, latest activity first, and how many in all (admin)."""
        return await self.store.user_summaries(limit=limit, offset=offset)

    async def history(self, user_id: str, memory_id: str) -> list[Event]:
        return await self.store.history(user_id, memory_id)

    async def export_linked(
        self, user_id: str, *, page: int = EXPORT_PAGE
    ) -> AsyncIterator[tuple[MemoryRecord, list[str]]]:
        """Every memory of the user, oldest first as the store iterates them, each with the ids
        linked to it, read a page of memories at a time (one query a page)."""
        records: list[MemoryRecord] = []
        async for record in self.store.iterate(user_id, page=page):
            records.append(record)
            if len(records) == page:
                for pair in await self._with_links(user_id, records):
                    yield pair
                records = []
        for pair in await self._with_links(user_id, records):
            yield pair

    async def _with_links(
        self, user_id: str, records: list[MemoryRecord]
    ) -> list[tuple[MemoryRecord, list[str]]]:
        linked = await self.store.linked(user_id, [r.id for r in records]) if records else {}
        return [(r, linked.get(r.id, [])) for r in records]

    async def stats(self, user_id: str) -> dict[str, Any]:
        stats = await self.store.stats(user_id)
        entry = self.cache.cached(user_id)
        stats["index"] = {
            "cached": entry is not None,
            "memories": len(entry) if entry is not None else 0,
            "embedding_model": self.embedder.model_name,
        }
        return stats

    async def search(
        self,
        user_id: str,
        query: str,
        *,
        limit: int,
        min_score: float,
        types: Sequence[str] = (),
        background: bool = False,
        now: datetime | None = None,
        links: bool = False,
    ) -> list[Found]:
        """Ranked as chat recall ranks (:mod:`app.memory.search.ranking`), with the memories
        loaded, and with the ids linked to each when `links`; `now`: when the query is asked
        (default now)."""
        hits = await self.searcher.search(
            user_id, query, limit=limit, min_score=min_score, types=types,
            background=background, now=now,
        )  # fmt: skip
        keys = [h.key for h in hits]
        if links:
            records, linked = await self.store.get_many_linked(user_id, keys)
        else:
            records, linked = await self.store.get_many(user_id, keys), {}
        return [
            Found(records[h.key], h, linked.get(records[h.key].id, ()))
            for h in hits
            if h.key in records
        ]

    async def recall(
        self,
        user_id: str,
        query: str | None,
        *,
        limit: int,
        min_score: float,
        budget_tokens: int,
        profile_tokens: int = 0,
        episode_share: float = 0.0,
        judge: Judge | None = None,
    ) -> Recalled:
        """What chat injects: the profile within `profile_tokens`, then what the search finds
        for `query` (without the profile's memories) within `budget_tokens`, of which episodes
        may take `episode_share` (:mod:`app.memory.search.selection`), from the candidates as
        `judge` orders them, when given (:mod:`app.memory.chat.judge`). Both carry what the
        memory block shows (from the index: no database read on this path)."""
        shares = Shares(profile_tokens, budget_tokens, episode_share)
        found = await self.searcher.recall(
            user_id, query, limit=limit, min_score=min_score, shown=shares, judge=judge
        )
        if found.relevant and not found.hits and not self._budget_warned:
            self._budget_warned = True  # once per process: the setting, not the chat, is wrong
            logger.warning(
                "MEMPROXY_MEMORY_TOKEN_BUDGET=%d is smaller than every relevant memory found: "
                "nothing was injected",
                budget_tokens,
            )
        return found

    async def mark_recalled(self, user_id: str, keys: Sequence[int]) -> None:
        await self.store.mark_recalled(user_id, keys)
