"""Per-user search indexes (dense and lexical), built lazily from the store and kept current.

Promises:

- an index is a cache of the store: :meth:`IndexCache.get` returns one that reflects at least the
  store's state when the call began. It reads the user's change sequence (one small query) and,
  when another process wrote since, reads back only the rows written since (``seq > version``),
  plus the key list when the count shows deletions;
- this process's own writes are applied in place (:meth:`IndexCache.written`,
  :meth:`IndexCache.deleted`) when they follow directly on the cached version, otherwise left to
  the next catch-up; an index is never marked newer than what it holds;
- memories without a vector of the configured model are embedded while loading, and the vectors
  stored back (a model change re-embeds lazily, or all at once with ``memproxy index rebuild``);
- the cache is bounded (least recently used users evicted) by the number of memories it holds,
  and an index not searched for ``idle_seconds`` is dropped; what is dropped is given back to
  the system (:mod:`.heap`);
- a large user's index is restored from its image and caught up as any stale index is, and is
  kept quick in the background (:mod:`.upkeep`: images, an approximate vector index); a first
  build yields to the event loop between batches: other chats go on meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from app.memory.search.dense import VectorIndex
from app.memory.search.embedder import TextEmbedder
from app.memory.search.heap import give_back
from app.memory.search.lexical import Analyzer, LexicalIndex
from app.memory.search.parts import decode, embed_for_store, vector_model
from app.memory.search.upkeep import Upkeep
from app.memory.search.user_index import UserIndex
from app.memory.store.memories import MemoryStore
from app.memory.store.records import IndexRow, Removed, Written
from app.memory.store.tables import MemoryType

logger = logging.getLogger("memproxy.memory")

SWEEP_SECONDS = 30.0
"""How often the cache looks for indexes idle past ``idle_seconds``."""
STORE_BATCH = 256
"""Memories embedded and written back per round while loading an index."""
BUILD_BATCH = 1000
"""Memories indexed between two yields to the event loop in a first build (~20-40 ms of work:
a 100,000-memory user's build no longer stalls everyone else's chats for seconds)."""


class IndexCache:
    def __init__(
        self,
        store: MemoryStore,
        embedder: TextEmbedder,
        *,
        max_memories: int = 300_000,
        analyzer: Analyzer | None = None,
        image_min_memories: int = 0,
        ivf_min_vectors: int = 0,
        idle_seconds: float = 0.0,
    ) -> None:
        self._store = store
        self._embedder = embedder
        self._analyzer = analyzer or Analyzer()
        self._max_memories = max_memories
        self._entries: OrderedDict[str, UserIndex] = OrderedDict()
        self._loading: dict[str, asyncio.Task[UserIndex]] = {}
        self._idle_seconds = idle_seconds
        """Drop an index not searched for this long (0: kept until evicted)."""
        self._used_at: dict[str, float] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._trims: set[asyncio.Task[None]] = set()
        self.upkeep = Upkeep(
            store,
            embedder,
            self._analyzer,
            image_min_memories=image_min_memories,
            ivf_min_vectors=ivf_min_vectors,
        )
        self.loads = 0
        """Full builds and catch-ups done (tests and metrics read it)."""

    def cached(self, user_id: str) -> UserIndex | None:
        return self._entries.get(user_id)

    async def get(self, user_id: str) -> UserIndex:
        """The user's index, current as of this call (see the module docstring)."""
        version = await self._store.version(user_id)
        now = time.monotonic()
        self._used_at[user_id] = now
        if self._idle_seconds and self._sweeper is None:  # also when no one chats any more
            self._sweeper = asyncio.get_running_loop().create_task(self._sweeping())
        entry = self._entries.get(user_id)
        if entry is not None and entry.version == version:
            self._entries.move_to_end(user_id)
            return entry
        task = self._loading.get(user_id) or self._start_load(user_id, images=True)
        entry = await asyncio.shield(task)
        if entry.version < version:  # that load began before the write we were told about
            return await self.get(user_id)
        return entry

    async def rebuild(self, user_id: str) -> UserIndex:
        """The user's index built afresh from the store (no image read, the stored one erased;
        the memories without a vector of this model embedded), then imaged when large
        enough (:meth:`settled` waits for it)."""
        while (task := self._loading.get(user_id)) is not None:
            await asyncio.shield(task)
        self.forget(user_id)
        await self._store.drop_image(user_id)
        return await asyncio.shield(self._start_load(user_id, images=False))

    def _start_load(self, user_id: str, *, images: bool) -> asyncio.Task[UserIndex]:
        """The user's load, as the one under way that later callers wait for."""
        task = asyncio.get_running_loop().create_task(self._load(user_id, images=images))
        self._loading[user_id] = task
        task.add_done_callback(lambda _: self._loading.pop(user_id, None))
        return task

    async def _load(self, user_id: str, *, images: bool) -> UserIndex:
        entry = self._entries.get(user_id)
        if entry is None:
            entry = await self.upkeep.restored(user_id) if images else None
            if entry is None:
                entry = await self._build(user_id)
            else:
                await self._catch_up(user_id, entry)
            self._entries[user_id] = entry
            self._used_at.setdefault(user_id, time.monotonic())
        else:
            await self._catch_up(user_id, entry)
        self.loads += 1
        self._entries.move_to_end(user_id)
        self._evict(keep=user_id)
        self.upkeep.offer(user_id, entry)
        return entry

    async def _build(self, user_id: str) -> UserIndex:
        snapshot = await self._store.snapshot(user_id)
        entry = UserIndex(
            snapshot.version, VectorIndex(self._embedder.dim), LexicalIndex(self._analyzer)
        )
        rows = snapshot.rows
        async with entry.lock:
            for start in range(0, len(rows), BUILD_BATCH):
                links = snapshot.links if start == 0 else ()
                await self._put(user_id, entry, rows[start : start + BUILD_BATCH], links)
                await asyncio.sleep(0)  # the entry is no one else's yet: let chats go on
        return entry

    async def _catch_up(self, user_id: str, entry: UserIndex) -> None:
        """Bring an index up to the store: the rows written since its version, and the
        deletions when the count says there were some."""
        # frozen first: while an image is made the user's searches go on, this waits unlocked
        async with entry.frozen, entry.lock:
            snapshot = await self._store.snapshot(user_id, since=entry.version)
            await self._put(user_id, entry, snapshot.rows, snapshot.links)
            if len(entry) != snapshot.total:  # deletions (or rows newer than the snapshot)
                keys = await self._store.keys(user_id)
                entry.drop([k for k in entry.briefs if k not in keys])
                missing = [k for k in keys if k not in entry.briefs]
                rows = await self._store.rows(user_id, missing)
                episodes = [r.key for r in rows if r.type == MemoryType.EPISODE.value]
                links = await self._store.links(user_id, episodes)
                await self._put(user_id, entry, rows, links)
            entry.version = snapshot.version

    async def _put(
        self,
        user_id: str,
        entry: UserIndex,
        rows: Sequence[IndexRow],
        links: Sequence[tuple[int, int]] = (),
    ) -> None:
        if rows:
            entry.put(rows, await self.vectors_for(user_id, rows), links)

    async def vectors_for(self, user_id: str, rows: Sequence[IndexRow]) -> list[np.ndarray]:
        """The rows' vectors: stored ones when of this model, the rest embedded and saved."""
        model = vector_model(self._embedder)
        out: list[np.ndarray | None] = [
            decode(r.embedding, self._embedder.dim)
            if r.embedding is not None and r.embedding_model == model
            else None
            for r in rows
        ]
        todo = [i for i, vectors in enumerate(out) if vectors is None]
        for start in range(0, len(todo), STORE_BATCH):
            chunk = todo[start : start + STORE_BATCH]
            embedded = await embed_for_store(self._embedder, [rows[i].key_text for i in chunk])
            for i, e in zip(chunk, embedded, strict=True):
                out[i] = e.vectors
            await self._store.set_embeddings(
                user_id,
                [(rows[i].key, e.embedding, e.model) for i, e in zip(chunk, embedded, strict=True)],
            )
        if todo:
            logger.info("embedded %d memories of a user with %s", len(todo), model)
        return [v for v in out if v is not None]

    def written(self, user_id: str, written: Written, vectors: Sequence[np.ndarray]) -> None:
        """This process wrote these rows (their (parts, dim) vectors given, in order)."""
        entry = self._current_before(user_id, written.version)
        if entry is not None:
            rows = [
                IndexRow(r.key, r.type, r.content, r.created_at, None, None,
                         r.pinned, r.profile, r.observed_at, r.recall_count, r.index_text)
                for r in written.records
            ]  # fmt: skip
            entry.put(rows, vectors, written.links)
            entry.version = written.version
            self.upkeep.offer(user_id, entry)

    def deleted(self, user_id: str, deleted: Removed) -> None:
        entry = self._current_before(user_id, deleted.version)
        if entry is not None:
            entry.drop(deleted.keys)
            entry.version = deleted.version
            self.upkeep.offer(user_id, entry)

    def _current_before(self, user_id: str, version: int) -> UserIndex | None:
        """The entry, if a write at `version` can be applied to it in place right now."""
        entry = self._entries.get(user_id)
        if entry is None or entry.lock.locked() or entry.frozen.locked():
            return None  # the next get() catches up from the store
        return entry if entry.version == version - 1 else None

    def _evict(self, keep: str) -> None:
        total = sum(len(e) for e in self._entries.values())
        dropped = 0
        for user_id in list(self._entries):
            if total <= self._max_memories:
                break
            if user_id == keep:
                continue
            total -= len(self._entries.pop(user_id))
            self._used_at.pop(user_id, None)
            dropped += 1
        if dropped:
            self._give_back()

    async def _sweeping(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            self.sweep(time.monotonic())

    def sweep(self, now: float) -> int:
        """Drop the indexes not searched since `now - idle_seconds` (least recently used
        first); how many."""
        dropped = 0
        for user_id in list(self._entries):  # least recently used first
            if now - self._used_at.get(user_id, 0.0) < self._idle_seconds:
                break
            entry = self._entries[user_id]
            if user_id in self._loading or entry.lock.locked() or entry.frozen.locked():
                continue
            del self._entries[user_id]
            self._used_at.pop(user_id, None)
            self.upkeep.forget(user_id)
            dropped += 1
        if dropped:
            logger.info("dropped the indexes of %d users not searched for a while", dropped)
            self._give_back()
        return dropped

    def _give_back(self) -> None:
        """Return the freed memory to the system, in a thread (~ms, more for a large heap)."""
        task = asyncio.get_running_loop().create_task(asyncio.to_thread(give_back))
        self._trims.add(task)
        task.add_done_callback(self._trims.discard)

    def forget(self, user_id: str | None = None) -> None:
        """Drop one user's index (or all): the next recall rebuilds it from the store."""
        if user_id is None:
            dropped = bool(self._entries)
            self._entries.clear()
            self._used_at.clear()
        else:
            dropped = self._entries.pop(user_id, None) is not None
            self._used_at.pop(user_id, None)
            self.upkeep.forget(user_id)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        if dropped:
            self._give_back()

    @property
    def memories_cached(self) -> int:
        return sum(len(e) for e in self._entries.values())

    async def settled(self) -> None:
        """Return once the background work under way is done (benches, tests)."""
        await self.upkeep.settled()
        await asyncio.gather(*self._trims)

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        await self.upkeep.close()
